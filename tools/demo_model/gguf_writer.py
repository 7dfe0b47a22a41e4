"""A GGUF v3 file writer: typed metadata, then tensor infos, then the tensors' data, each aligned
to 32 bytes (model/gguf/gguf_types.hpp describes the layout; this writes what mqlm's reader and
llama.cpp's read). Standard library only, little-endian.

Tensors come as bytes already in their GGUF layout; dims are GGUF's, dims[0] the contiguous one,
so a (rows, cols) row-major matrix has dims [cols, rows]. Q8_0 and F16 bytes come from
llama_model.weight_bytes().
"""
import os
import struct

MAGIC = 0x46554747  # "GGUF" read as a little-endian u32
VERSION = 3
ALIGNMENT = 32

# Value type ids.
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
# Tensor type ids and (elements, bytes) per block.
TENSOR_F32, TENSOR_F16, TENSOR_Q8_0 = 0, 1, 8
BLOCKS = {TENSOR_F32: (1, 4), TENSOR_F16: (1, 2), TENSOR_Q8_0: (32, 34)}


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _scalar(value_type, value) -> bytes:
    if value_type == U32:
        return struct.pack("<I", value)
    if value_type == I32:
        return struct.pack("<i", value)
    if value_type == F32:
        return struct.pack("<f", value)
    if value_type == BOOL:
        return struct.pack("<B", 1 if value else 0)
    if value_type == STRING:
        return _string(value)
    raise ValueError(f"value type {value_type} is not written here")


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class GgufWriter:
    def __init__(self):
        self._metadata = []  # (key, encoded type and value)
        self._tensors = []   # (name, dims, type, data)

    def set(self, key: str, value_type: int, value):
        self._metadata.append((key, struct.pack("<I", value_type) + _scalar(value_type, value)))

    def set_array(self, key: str, element_type: int, values):
        body = b"".join(_scalar(element_type, v) for v in values)
        self._metadata.append((key, struct.pack("<IIQ", ARRAY, element_type, len(values)) + body))

    def add_tensor(self, name: str, tensor_type: int, dims, data: bytes):
        elements_per_block, bytes_per_block = BLOCKS[tensor_type]
        elements = 1
        for d in dims:
            elements *= d
        if dims[0] % elements_per_block or len(data) != elements // elements_per_block * bytes_per_block:
            raise ValueError(f"{name}: {len(data)} bytes do not fit dims {dims} of type {tensor_type}")
        self._tensors.append((name, list(dims), tensor_type, data))

    def write(self, path: str):
        header = [struct.pack("<IIQQ", MAGIC, VERSION, len(self._tensors), len(self._metadata))]
        for key, encoded in self._metadata:
            header.append(_string(key) + encoded)
        offset = 0
        for name, dims, tensor_type, data in self._tensors:
            header.append(_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) +
                          struct.pack("<IQ", tensor_type, offset))
            offset = _align(offset + len(data))
        head = b"".join(header)
        partial = path + ".partial"
        with open(partial, "wb") as f:
            f.write(head + bytes(_align(len(head)) - len(head)))
            for i, (_, _, _, data) in enumerate(self._tensors):
                f.write(data)
                if i + 1 < len(self._tensors):
                    f.write(bytes(_align(len(data)) - len(data)))
        os.replace(partial, path)
