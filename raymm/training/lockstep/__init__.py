"""Lock-step training of many devices at once (the fast path): plan a program (`trainer`: buckets
and chunks of devices, their stacked starting values; the program as data: `program`), yield its
batches (drawn as the sequential path draws them: `batches`), and pick its gradient once
(`gradients`: closed form, encoders outside `vmap`, or `vmap` + autograd), then run the one local
update with it. Beside it: encoders run only for the devices that need them (`encoders`), a
frozen encoder's embeddings computed once a round and kept from round to round (`frozen_cache`),
the engine's own closed form of a `Linear`/`ReLU` chain under cross-entropy (`closed_form`), and
what happens when a program fails (`fallback`).
"""
