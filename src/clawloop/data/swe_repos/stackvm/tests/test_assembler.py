from stackvm import AsmError, Instruction, assemble, disassemble


def asm_error_line(source):
    try:
        assemble(source)
    except AsmError as e:
        return e.line
    return None


def test_assemble_simple():
    assert assemble("push 2\npush -3\nadd\nprint") == [Instruction("push", 2), Instruction("push", -3),
                                                        Instruction("add"), Instruction("print")]


def test_comments_and_blank_lines():
    assert assemble("; nothing\n\n  PUSH 1 ; one\n") == [Instruction("push", 1)]


def test_labels_resolve_to_addresses():
    program = assemble("start:\n  push 1\nloop: jmp loop\n  jz start\nend:")
    assert program == [Instruction("push", 1), Instruction("jmp", 1), Instruction("jz", 0)]


def test_forward_label():
    assert assemble("jmp end\npush 1\nend: halt") == [Instruction("jmp", 2), Instruction("push", 1),
                                                      Instruction("halt")]


def test_numeric_jump_target():
    assert assemble("jmp 0") == [Instruction("jmp", 0)]


def test_unknown_instruction():
    assert asm_error_line("push 1\nfly 2") == 2


def test_operand_count():
    assert asm_error_line("add 1") == 1
    assert asm_error_line("nop\n") == 1
    assert asm_error_line("push 1\npush") == 2


def test_bad_integer():
    assert asm_error_line("push 1.5") == 1
    assert asm_error_line("push --1") == 1


def test_unknown_label():
    assert asm_error_line("push 1\n\njmp nowhere") == 3


def test_duplicate_label():
    assert asm_error_line("a: push 1\na: push 2") == 2


def test_bad_label():
    assert asm_error_line("9x: push 1") == 1


def test_disassemble():
    text = disassemble(assemble("\n".join(["push 1"] * 10 + ["jmp 3"])))
    lines = text.splitlines()
    assert lines[0] == " 0  push 1"
    assert lines[10] == "10  jmp 3"


def test_disassemble_empty():
    assert disassemble([]) == ""
