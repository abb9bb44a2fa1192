"""Units every layer shares: the size of a transmitted parameter and the budget unit."""

#: bytes of one float32 value on the wire (parameters, prototypes and class means travel so)
FLOAT_BYTES = 4

#: bytes in a GiB: traffic budgets (`eval.budget_gib`, Acc@B) and reports are in GiB
GIB = float(1 << 30)
