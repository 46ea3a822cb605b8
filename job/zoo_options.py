"""The zoo's models and their options, for checking a job's model options without the zoo.

`autopar.planner.zoo` reads a model's options from its factory's signature, and importing any
factory imports torch: about 450 MB of the operator's memory for a check of option names.  This
table is `{name: autopar.planner.zoo.model_options(name)}` written out, and
`autopar.job.pipeline.checked_model_options` (the one check, for `autopar run --local` and the
operator alike) reads it; tests/job/test_zoo_options.py fails when it and the zoo disagree.
"""

from __future__ import annotations

from typing import Any

ZOO_OPTIONS: dict[str, dict[str, Any]] = {
    "lenet": {"batch": 64, "image": 28, "channels": 1, "classes": 10, "seed": 0},
    "alexnet": {"batch": 256, "image": 224, "classes": 1000, "fc": 4096, "dropout": 0.5, "seed": 0},
    "vgg16": {"batch": 64, "image": 224, "classes": 1000, "fc": 4096, "dropout": 0.5, "seed": 0},
    "inception_v3": {"batch": 64, "image": 299, "classes": 1000, "dropout": 0.5, "seed": 0},
    "resnet101": {"batch": 64, "image": 224, "classes": 1000, "width": 64, "blocks": (3, 4, 23, 3), "seed": 0},
    "rnntc": {"batch": 64, "steps": 40, "vocab": 20000, "embed": 1024, "hidden": 1024, "layers": 4, "classes": 2,
              "seed": 0},
    "rnnlm": {"batch": 64, "steps": 40, "vocab": 10000, "embed": 2048, "hidden": 2048, "layers": 2, "seed": 0},
    "nmt": {"batch": 64, "src_len": 40, "tgt_len": 40, "src_vocab": 32000, "tgt_vocab": 32000, "embed": 1024,
            "hidden": 1024, "layers": 2, "seed": 0},
    "transformer": {"batch": 64, "seq": 1024, "vocab": 50304, "d": 768, "layers": 12, "heads": 12, "seed": 0},
}
