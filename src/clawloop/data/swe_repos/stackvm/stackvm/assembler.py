"""Text to instructions: one instruction per line, `label:` marks an address, `;` starts a comment."""

OPCODES = {
    # name: number of operands
    "push": 1, "pop": 0, "dup": 0, "swap": 0, "over": 0,
    "add": 0, "sub": 0, "mul": 0, "div": 0, "mod": 0, "neg": 0,
    "eq": 0, "lt": 0, "gt": 0, "not": 0,
    "jmp": 1, "jz": 1, "jnz": 1, "call": 1, "ret": 0,
    "load": 1, "store": 1, "print": 0, "halt": 0,
}
JUMPS = ("jmp", "jz", "jnz", "call")


class AsmError(Exception):
    def __init__(self, message, line):
        super().__init__(f"line {line}: {message}")
        self.line = line


class Instruction:
    __slots__ = ("op", "arg")

    def __init__(self, op, arg=None):
        self.op = op
        self.arg = arg

    def __repr__(self):
        return self.op if self.arg is None else f"{self.op} {self.arg}"

    def __eq__(self, other):
        return isinstance(other, Instruction) and (self.op, self.arg) == (other.op, other.arg)


def _parse_int(text, line):
    body = text[1:] if text[:1] in "+-" else text
    if not body.isdigit():
        raise AsmError(f"expected an integer, found {text!r}", line)
    return int(text)


def assemble(source):
    """A list of Instructions; jump targets resolved to addresses (label or number)."""
    labels = {}
    pending = []  # (op, raw argument, line number)
    for number, raw in enumerate(source.splitlines(), start=1):
        line = raw.split(";", 1)[0].strip()
        while ":" in line:
            label, line = line.split(":", 1)
            label = label.strip()
            if not label.isidentifier():
                raise AsmError(f"bad label {label!r}", number)
            if label in labels:
                raise AsmError(f"label {label!r} defined twice", number)
            labels[label] = len(pending)
            line = line.strip()
        if not line:
            continue
        parts = line.split()
        op = parts[0].lower()
        if op not in OPCODES:
            raise AsmError(f"unknown instruction {op!r}", number)
        if len(parts) - 1 != OPCODES[op]:
            raise AsmError(f"{op} takes {OPCODES[op]} operand(s), got {len(parts) - 1}", number)
        pending.append((op, parts[1] if len(parts) > 1 else None, number))
    program = []
    for op, arg, number in pending:
        if arg is None:
            program.append(Instruction(op))
        elif op in JUMPS and arg in labels:
            program.append(Instruction(op, labels[arg]))
        elif op in JUMPS and not arg.lstrip("+-").isdigit():
            raise AsmError(f"unknown label {arg!r}", number)
        else:
            program.append(Instruction(op, _parse_int(arg, number)))
    return program


def disassemble(program):
    """The program as text, one instruction per line, with its address."""
    width = len(str(max(len(program) - 1, 0)))
    return "\n".join(f"{i:>{width}}  {ins!r}" for i, ins in enumerate(program))
