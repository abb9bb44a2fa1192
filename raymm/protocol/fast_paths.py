"""Hand-written reverse passes of lock-step programs, registered under their objective's name.

A lock-step program (`raymm.training.lockstep`) takes its gradients by `vmap` and autograd,
which works for any vectorisable objective. For a few objectives someone has written the
reverse pass out as batched products, which is faster for small models. Such a fast path is not
declared on `Objective`: an objective's author never writes one nor reads about them. Whoever
writes one registers it here under the objective's registered name (`register_closed_form`),
beside its code, and the program looks it up (`closed_form_for`) by the objective's class:
exactly the class registered under that name, so a subclass that changes `loss` does not
inherit a reverse pass that no longer matches it.

A fast path must give `Objective.loss`'s numbers to float32 rounding (its tests hold it so),
and `execution.training.closed_form: false` turns every one off. Registered today:
  * `ce`, by `raymm.training.lockstep.closed_form`: cross-entropy, whose gradient the engine
    writes out itself for a model it knows (a chain of `Linear` and `ReLU`);
  * `tide`, by `policies/objective/tide_closed_form.py`: TIDE's loss after the encoders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from raymm.models.network import RaymmNet
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import Objective


class ClosedFormLoss(Protocol):
    """An objective's loss after the encoders, with its reverse pass written by hand, for k
    devices of a lock-step program at once (`ClosedForm.after_encoders` builds one).

    Called with every tensor stacked along a leading device axis of k: `params` the trained
    parameters (name -> [k, ...]), `emb` every sensor's embeddings [k, B, E] (the model's
    sensor order), `y` [k, B], `present` float [k, B, M], `weight` float [k, B] (1 real row, 0
    padding) and the round's `extras` (the same for every device). Returns each device's loss
    [k] (what `Objective.loss` gives, without a proximal term the trainer adds itself), the
    gradients of the parameters it reads (a parameter it does not read: absent) and of each
    sensor's embeddings; the trainer takes the encoders' gradients from those by autograd."""

    def __call__(self, params: Mapping[str, Tensor], emb: Mapping[str, Tensor], y: Tensor,
                 present: Tensor, weight: Tensor, extras: Mapping[str, Tensor]
                 ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]: ...


#: (objective, model, names of the trained stacked parameters, whether `LossInputs.out` was
#: made with the adapter) -> the loss after the encoders, or None where it does not cover them
AfterEncoders = Callable[[Objective, RaymmNet, Sequence[str], bool], "ClosedFormLoss | None"]


@dataclass(frozen=True)
class ClosedForm:
    """What a lock-step program may take by hand for one objective; each part is optional."""

    #: True for an instance whose `loss` is the task head's mean cross-entropy
    #: (`raymm.protocol.losses.mean_cross_entropy` of `out.logits`) plus, at most, its
    #: `proximal` term: the program then takes the whole gradient of a model the engine knows
    #: by the engine's own step (`raymm.training.lockstep.closed_form`)
    task_cross_entropy: Callable[[Objective], bool] | None = None
    #: builds the loss from the embeddings on (`ClosedFormLoss`), once per program; the
    #: program runs the encoders and differentiates them by autograd
    after_encoders: AfterEncoders | None = None


#: objective name -> its fast path
CLOSED_FORMS: dict[str, ClosedForm] = {}


def register_closed_form(name: str, closed: ClosedForm) -> None:
    """Register `closed` for the objective registered as `name` (which may be registered
    later: the lookup is by name at run time)."""
    if CLOSED_FORMS.get(name, closed) is not closed:
        raise ValueError(f"a closed form for objective {name!r} is registered twice")
    CLOSED_FORMS[name] = closed


def closed_form_for(objective: Objective) -> ClosedForm | None:
    """The fast path registered for the name under which `objective`'s own class is
    registered, or None (then the program keeps autograd)."""
    for name in OBJECTIVES:
        if OBJECTIVES.get(name) is type(objective) and name in CLOSED_FORMS:
            return CLOSED_FORMS[name]
    return None
