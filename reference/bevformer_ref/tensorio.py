"""File formats: safetensors (read, numpy only), PyTorch / mmcv checkpoints (.pth), PNG (read)."""

from __future__ import annotations

import collections
import json
import pickle
import struct
import types
import zlib

import numpy as np

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def read_safetensors(path: str) -> "collections.OrderedDict[str, np.ndarray]":
    """8-byte little-endian header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = collections.OrderedDict()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt == "BF16":  # widen to float32 through the upper 16 bits
            s, e = info["data_offsets"]
            raw = np.frombuffer(data[s:e], dtype="<u2").astype(np.uint32) << 16
            out[name] = raw.view(np.float32).reshape(info["shape"])
            continue
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        s, e = info["data_offsets"]
        dtype = np.dtype(_ST_DTYPES[dt]).newbyteorder("<")
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if e - s != count * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name} has {e - s} bytes for shape {list(shape)} {dt}")
        out[name] = np.frombuffer(data[s:e], dtype=dtype).reshape(shape)
    return out


# ---------------------------------------------------------------------------------------------
# .pth checkpoints

class _Opaque:
    """Stands in for any global a checkpoint's meta or optimizer names that we do not trust."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state

    def __call__(self, *args, **kwargs):
        return _Opaque(*args, **kwargs)


def _allowed_global(module: str, name: str):
    import torch
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_parameter",
                                             "_rebuild_parameter_with_state"):
        return getattr(torch._utils, name)
    if module == "torch" and (name.endswith("Storage") or name in ("Size", "device")):
        return getattr(torch, name)
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    if module == "builtins" and name in ("set", "frozenset", "slice", "range", "complex"):
        import builtins
        return getattr(builtins, name)
    return None


class _LenientUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        obj = _allowed_global(module, name)
        if obj is not None:
            return obj
        return type(f"Opaque[{module}.{name}]", (_Opaque,), {})


_lenient_pickle = types.SimpleNamespace(__name__="bevformer_ref_lenient_pickle",
                                        Unpickler=_LenientUnpickler, load=pickle.load,
                                        UnpicklingError=pickle.UnpicklingError)


def load_state_dict(path: str):
    """Returns ({name: torch.Tensor}, meta or None).

    .safetensors: read with the numpy reader above. .pth (torch zip or legacy): torch.load with
    weights_only where this torch has it; a checkpoint whose meta or optimizer names other
    globals is loaded again through an unpickler that builds tensors and OrderedDicts and turns
    every other global into an inert placeholder (nothing from the file is ever called).
    A top-level {'state_dict': ...} (mmcv) is unwrapped; an 'optimizer' entry is ignored.
    """
    import torch
    if path.endswith(".safetensors"):
        return {k: torch.from_numpy(np.array(v)) for k, v in read_safetensors(path).items()}, None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # torch < 1.13: no weights_only
        obj = torch.load(path, map_location="cpu", pickle_module=_lenient_pickle)
    except (pickle.UnpicklingError, RuntimeError, AttributeError):
        obj = torch.load(path, map_location="cpu", pickle_module=_lenient_pickle)
    meta = None
    if isinstance(obj, dict) and "state_dict" in obj:
        meta = obj.get("meta")
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: no state_dict inside (got {type(obj).__name__})")
    sd = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            sd[k[7:] if k.startswith("module.") else k] = v
    return sd, meta


# ---------------------------------------------------------------------------------------------
# PNG (8-bit gray / RGB / RGBA, non-interlaced): enough for the golden sets' camera images.

def read_png_rgb(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat, ihdr = 8, [], None
    while pos < len(blob):
        (length,) = struct.unpack(">I", blob[pos:pos + 4])
        kind = blob[pos + 4:pos + 8]
        body = blob[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    w, h, depth, color, _, _, interlace = ihdr
    channels = {0: 1, 2: 3, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace:
        raise ValueError(f"{path}: only 8-bit non-interlaced gray/RGB/RGBA PNGs (depth {depth}, color {color})")
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = w * channels
    raw = raw.reshape(h, stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(h):
        ftype, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        cur = np.zeros(stride, dtype=np.int32)
        if ftype == 0:
            cur = line
        elif ftype == 2:
            cur = (line + prev) & 255
        else:  # Sub, Average, Paeth depend on the reconstructed left neighbour: per byte
            for i in range(stride):
                a = cur[i - channels] if i >= channels else 0
                b = prev[i]
                c = prev[i - channels] if i >= channels else 0
                if ftype == 1:
                    pred = a
                elif ftype == 3:
                    pred = (a + b) >> 1
                elif ftype == 4:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if (pa <= pb and pa <= pc) else (b if pb <= pc else c)
                else:
                    raise ValueError(f"{path}: bad PNG filter {ftype}")
                cur[i] = (int(line[i]) + pred) & 255
        out[y] = cur
        prev = cur
    img = out.reshape(h, w, channels)
    if channels == 1:
        img = np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3])
