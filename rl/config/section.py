"""The base of every config section, and the words sections share (device, dtype).

A section forbids unknown keys and validates assignments, so a typo fails before any actor starts. The docstring
under a field is its description (`use_attribute_docstrings`): `rl.config.reference` writes them into the docs.
The torch dtype of a `DType` word is `rl.precision.TORCH_DTYPES` (this module stays free of torch).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Device = Literal["cpu", "cuda"]
DType = Literal["float32", "bfloat16", "float16"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
