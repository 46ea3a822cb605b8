"""The model zoo: the papers' benchmark models as ordinary single-device ``nn.Module``s.

CNNs of OptCNN sec. 6 and FlexFlow sec. 8.1 (``lenet``, ``alexnet``, ``vgg16``, ``inception_v3``,
``resnet101``), FlexFlow's recurrent models (``rnntc``, ``rnnlm``, ``nmt``: LSTM cells in Python
loops that torch.fx unrolls into one op per step sharing parameters) and a GPT-2 small style
``transformer``.  Model code holds no parallelism: the planner traces it with torch.fx and fake
tensors, and the trainer shards it from the plan.

Every model returns logits ``(N, C)`` or ``(N, L, C)`` and is trained with ``"cross_entropy"``
(positions flattened into samples for 3-D logits; `ModelSpec.compute_loss`).

    spec = get_model("nmt", batch=8, hidden=256)
    logits = spec.module(*spec.example_inputs())
    loss = spec.compute_loss(logits, spec.example_target())
"""

from ..ir.graph import TensorSpec
from .registry import get_model, list_models, load_model, model_options, parse_options
from .spec import FLOAT_DTYPES, ModelSpec, seeded, with_dtype

# TensorSpec is the IR's; it is exported here too because every factory of a user's model needs
# it next to ModelSpec (`from autopar.planner.zoo import ModelSpec, TensorSpec`).
__all__ = ["FLOAT_DTYPES", "ModelSpec", "TensorSpec", "get_model", "list_models", "load_model", "model_options",
           "parse_options", "seeded", "with_dtype"]
