"""One way to give a model's modules a faster method: the modules `load_model` patches
(vlm/picture_attention.py, unique_pictures.py, fused_norms.py, rope_index.py) each keep their
class's own method to fall back on."""
from __future__ import annotations

import types


def replace_method(model, name: str, applies, make) -> int:
    """Bind `make(the class's own method, module)` as `name` on every module of `model` for which
    `applies(module name, module)` holds, once per module and `make`; returns how many."""
    flag = f"_patched_{make.__name__}"
    patched = 0
    for module_name, module in model.named_modules():
        if applies(module_name, module) and not getattr(module, flag, False):
            setattr(module, name, types.MethodType(make(getattr(type(module), name), module), module))
            setattr(module, flag, True)
            patched += 1
    return patched
