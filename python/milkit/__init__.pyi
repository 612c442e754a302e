"""Type stubs of the `milkit` module (docs/python.md)."""

import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Optional, Union, overload

import numpy as np

__version__: str

class MilkitError(RuntimeError):
    """A milkit error; the message is the one the `milkit` command prints."""

class MLState:
    """A model's Core ML states between predictions (from `MLModel.make_state()`)."""
    def read_state(self, name: str) -> np.ndarray: ...
    def write_state(self, name: str, value: np.ndarray) -> None: ...
    def names(self) -> list[str]: ...

class Feature:
    name: str
    type: str
    dtype: Optional[str]
    shape: Optional[tuple[int, ...]]
    flexible: Optional[dict[str, list[tuple[Any, ...]]]]
    doc: str
    color_space: Optional[str]
    def accepts(self, shape: tuple[int, ...]) -> bool: ...

class FeatureDescription(Mapping[str, Feature]):
    def __getitem__(self, name: str) -> Feature: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...

Output = Union[np.ndarray, str, list[str], dict[Any, float]]

class MLModel:
    def __init__(
        self,
        model: Union[str, os.PathLike[str]],
        function_name: Optional[str] = None,
        compute: Literal["package", "fp32", "bf16"] = "package",
        *,
        seed: int = 0,
        max_memory: Optional[int] = None,
        compute_units: Any = None,
    ) -> None: ...
    @property
    def package_path(self) -> str: ...
    @property
    def function_name(self) -> Optional[str]: ...
    @property
    def function_names(self) -> list[str]: ...
    @property
    def input_description(self) -> FeatureDescription: ...
    @property
    def output_description(self) -> FeatureDescription: ...
    @property
    def state_description(self) -> FeatureDescription: ...
    def make_state(self) -> MLState: ...
    @overload
    def predict(self, data: dict[str, Any], state: Optional[MLState] = None) -> dict[str, Output]: ...
    @overload
    def predict(self, data: list[dict[str, Any]], state: None = None) -> list[dict[str, Output]]: ...

def use_with_coremltools(force: bool = False) -> bool: ...

def transcribe(models: Union[str, os.PathLike[str]], audio: Union[str, os.PathLike[str]],
               **options: Any) -> dict[str, Any]: ...
def export(model: Union[str, os.PathLike[str]], out: Union[str, os.PathLike[str]],
           **options: Any) -> dict[str, Any]: ...
def verify(package: Union[str, os.PathLike[str]], **expectations: Any) -> dict[str, Any]: ...
