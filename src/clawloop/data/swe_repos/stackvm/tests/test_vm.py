from stackvm import VM, VMError, assemble, run

FACTORIAL = """
    push 5
    call fact
    print
    halt
fact:
    dup
    push 2
    lt
    jnz done
    dup
    push 1
    sub
    call fact
    mul
done:
    ret
"""

COUNTDOWN = """
    push 3
    store 0
loop:
    load 0
    jz end
    load 0
    print
    load 0
    push 1
    sub
    store 0
    jmp loop
end:
"""


def vm_error(source, **options):
    try:
        run(source, **options)
    except VMError as e:
        return str(e)
    return None


def test_arithmetic():
    assert run("push 7\npush 3\nsub\nprint\npush 6\npush 4\nmul\nprint") == [4, 24]


def test_division_floors():
    assert run("push 7\npush 2\ndiv\nprint\npush -7\npush 2\ndiv\nprint\npush 7\npush 3\nmod\nprint") == [3, -4, 1]


def test_comparisons():
    assert run("push 1\npush 2\nlt\nprint\npush 1\npush 2\ngt\nprint\npush 2\npush 2\neq\nprint") == [1, 0, 1]


def test_not_and_neg():
    assert run("push 0\nnot\nprint\npush 5\nnot\nprint\npush 5\nneg\nprint") == [1, 0, -5]


def test_stack_ops():
    assert run("push 1\npush 2\nswap\nprint\nprint") == [1, 2]
    assert run("push 1\npush 2\nover\nprint\nprint\nprint") == [1, 2, 1]
    assert run("push 4\ndup\nadd\nprint") == [8]


def test_pop():
    assert run("push 1\npush 2\npop\nprint") == [1]


def test_factorial():
    assert run(FACTORIAL) == [120]


def test_loop_with_memory():
    assert run(COUNTDOWN) == [3, 2, 1]


def test_jz_not_taken():
    assert run("push 1\njz skip\npush 9\nprint\nskip: halt") == [9]


def test_jnz():
    assert run("push 0\njnz skip\npush 9\nprint\nskip: push 8\nprint") == [9, 8]


def test_halt_stops():
    assert run("push 1\nprint\nhalt\npush 2\nprint") == [1]


def test_state_after_run():
    vm = VM(assemble("push 1\npush 2\npush 3\nstore 2"))
    vm.run()
    assert vm.stack == [1, 2]
    assert vm.memory[2] == 3
    assert vm.pc == 4
    assert vm.steps == 4


def test_underflow():
    assert vm_error("add") == "stack underflow at 0"


def test_division_by_zero():
    assert vm_error("push 1\npush 0\ndiv") == "division by zero at 2"


def test_step_limit():
    assert vm_error("loop: jmp loop", max_steps=50) == "step limit of 50 reached"


def test_stack_overflow():
    assert vm_error("loop: push 1\njmp loop", max_stack=8) == "stack overflow at 0"


def test_ret_without_call():
    assert vm_error("ret") == "ret with an empty call stack at 0"


def test_memory_bounds():
    assert vm_error("load 16") == "memory cell 16 out of range at 0"
    assert vm_error("push 1\nstore -1") == "memory cell -1 out of range at 1"
    assert run("push 7\nstore 15\nload 15\nprint") == [7]


def test_jump_bounds():
    assert vm_error("jmp 5") == "jump to 5 outside the program at 0"
    assert run("push 1\njmp 3\npush 2\n") == []
