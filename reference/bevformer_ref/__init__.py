"""bevformer_ref: a plain-PyTorch (CPU, float32) reference implementation of BEVFormer v1
inference, written from docs/bevformer-spec.md to check and time bevformer.cpp against."""

from .config import ModelCfg, load_config, preset, from_json  # noqa: F401
from .model import BEVFormer, Frame, History, build, preprocess  # noqa: F401
from .tensorio import read_safetensors, load_state_dict, read_png_rgb  # noqa: F401
