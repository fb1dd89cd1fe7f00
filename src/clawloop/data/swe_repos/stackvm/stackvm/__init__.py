"""stackvm: a small stack machine and its assembler."""

from stackvm.assembler import AsmError, Instruction, assemble, disassemble
from stackvm.vm import VM, VMError, run

__all__ = ["AsmError", "Instruction", "assemble", "disassemble", "VM", "VMError", "run"]
