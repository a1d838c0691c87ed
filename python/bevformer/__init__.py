"""bevformer: BEVFormer on bevformer.cpp's engine, from Python (docs/PYTHON.md).

    import bevformer
    with bevformer.BEVFormer.from_pretrained("tiny", "bevformer_tiny_epoch_24.pth") as model:
        result = model(**bevformer.load_sample("frame.json"))
        print(result.boxes, result.scores, result.labels)
"""

from . import _bevformer
from ._bevformer import (BusyError, Error, InternalError, InvalidInputError, IoError, NotFoundError,
                         UnsupportedError, available_backends, require_backend, write_random_weights)
from ._model import BEVFormer, Knobs, Result, Runner
from ._request import (convert_info, frame_json, load_sample, nuscenes_results_json, read_image,
                       synthetic_request)
from . import profiling

__version__ = _bevformer.__version__


def versions():
    """Versions of this build's parts (bevformer, oneDNN, OpenCV, pybind11) and of numpy and Python."""
    import platform

    import numpy

    v = dict(_bevformer.versions())
    v["numpy"] = numpy.__version__
    v["python"] = platform.python_version()
    return v


__all__ = ["BEVFormer", "Knobs", "Result", "Runner", "Error", "InvalidInputError", "NotFoundError",
           "UnsupportedError", "IoError", "InternalError", "BusyError", "available_backends",
           "require_backend", "write_random_weights", "load_sample", "synthetic_request", "read_image",
           "frame_json", "convert_info", "nuscenes_results_json", "profiling", "versions", "__version__"]
