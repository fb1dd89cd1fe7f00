"""Running assembled programs."""

from stackvm.assembler import assemble


class VMError(Exception):
    pass


class VM:
    """One machine: a value stack, a call stack, `memory_size` memory cells and what was printed."""

    def __init__(self, program, memory_size=16, max_steps=100_000, max_stack=1024):
        self.program = program
        self.memory = [0] * memory_size
        self.max_steps = max_steps
        self.max_stack = max_stack
        self.stack = []
        self.calls = []
        self.output = []
        self.pc = 0
        self.steps = 0

    def push(self, value):
        if len(self.stack) >= self.max_stack:
            raise VMError(f"stack overflow at {self.pc}")
        self.stack.append(value)

    def pop(self):
        if not self.stack:
            raise VMError(f"stack underflow at {self.pc}")
        return self.stack.pop()

    def _cell(self, index):
        if not 0 <= index < len(self.memory):
            raise VMError(f"memory cell {index} out of range at {self.pc}")
        return index

    def _jump(self, target):
        if not 0 <= target <= len(self.program):
            raise VMError(f"jump to {target} outside the program at {self.pc}")
        return target

    def step(self):
        """Run one instruction; False once the machine halted."""
        if self.pc >= len(self.program):
            return False
        self.steps += 1
        if self.steps > self.max_steps:
            raise VMError(f"step limit of {self.max_steps} reached")
        ins = self.program[self.pc]
        op, arg = ins.op, ins.arg
        next_pc = self.pc + 1
        if op == "push":
            self.push(arg)
        elif op == "pop":
            self.pop()
        elif op == "dup":
            value = self.pop()
            self.push(value)
            self.push(value)
        elif op == "swap":
            b, a = self.pop(), self.pop()
            self.push(b)
            self.push(a)
        elif op == "over":
            b, a = self.pop(), self.pop()
            self.push(a)
            self.push(b)
            self.push(a)
        elif op in ("add", "sub", "mul", "div", "mod", "eq", "lt", "gt"):
            b, a = self.pop(), self.pop()
            self.push(self._arith(op, a, b))
        elif op == "neg":
            self.push(-self.pop())
        elif op == "not":
            self.push(1 if self.pop() == 0 else 0)
        elif op == "jmp":
            next_pc = self._jump(arg)
        elif op == "jz":
            if self.pop() == 0:
                next_pc = self._jump(arg)
        elif op == "jnz":
            if self.pop() != 0:
                next_pc = self._jump(arg)
        elif op == "call":
            if len(self.calls) >= self.max_stack:
                raise VMError(f"call stack overflow at {self.pc}")
            self.calls.append(next_pc)
            next_pc = self._jump(arg)
        elif op == "ret":
            if not self.calls:
                raise VMError(f"ret with an empty call stack at {self.pc}")
            next_pc = self.calls.pop()
        elif op == "load":
            self.push(self.memory[self._cell(arg)])
        elif op == "store":
            self.memory[self._cell(arg)] = self.pop()
        elif op == "print":
            self.output.append(self.pop())
        elif op == "halt":
            next_pc = len(self.program)
        else:
            raise VMError(f"unknown instruction {op!r} at {self.pc}")
        self.pc = next_pc
        return self.pc < len(self.program)

    def _arith(self, op, a, b):
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op in ("div", "mod"):
            if b == 0:
                raise VMError(f"division by zero at {self.pc}")
            return a // b if op == "div" else a % b
        if op == "eq":
            return int(a == b)
        if op == "lt":
            return int(a < b)
        return int(a > b)

    def run(self):
        while self.step():
            pass
        return self.output


def run(program, **options):
    """Run `program` (Instructions or assembly text) and return what it printed."""
    if isinstance(program, str):
        program = assemble(program)
    return VM(program, **options).run()
