"""The simulated devices as columns (tiers, availability clocks, hardware, data slices;
`devices`), how the training samples are partitioned over them (`partition`), and
deterministic fault injection (`faults`). Nothing here holds a model.

May import: base, io, config, data.
"""
