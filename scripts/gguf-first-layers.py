#!/usr/bin/env python3
"""Writes a GGUF holding the first N transformer layers of another (token embedding, those
layers, the output norm and head, every metadata key, <arch>.block_count set to N and
general.name marked), for moving a smaller model where a transfer is size-limited: the
tensors are copied byte for byte, in their stored types. The result is a valid, smaller
model of the same architecture and tokenizer, not the original model: its text is worse.

    scripts/gguf-first-layers.py SRC.gguf DST.gguf N
"""
import sys

import gguf
import numpy as np


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_layers = r.fields[f"{arch}.block_count"].contents()
    if not 1 <= keep <= n_layers:
        sys.exit(f"gguf-first-layers: N must be 1..{n_layers}")
    w = gguf.GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        if key == f"{arch}.block_count":
            val = keep
        elif key == "general.name":
            val = f"{val} (first {keep} of {n_layers} layers)"
        w.add_key_value(key, val, vtype, sub)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= keep:
            continue
        float_type = t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=None if float_type else t.data.shape,
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: {keep} of {n_layers} layers")


if __name__ == "__main__":
    main()
