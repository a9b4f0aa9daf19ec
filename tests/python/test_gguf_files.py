"""loader/gguf against an independent implementation: gguf-py (llama.cpp's Python package)
writes and reads the files, our C parser dumps what it sees, and the two must agree.

The dumper is a few lines of C compiled here against src/loader/gguf.c (no library
build needed, so this runs even while other modules are mid-edit)."""
import math
import shutil
import subprocess

import gguf
import numpy as np
import pytest

from conftest import DEFAULT_MODEL, ROOT

DUMPER = r"""
#include "loader/gguf.h"
#include "util/err.h"
#include "util/mapfile.h"
#include <stdio.h>
static void hex(struct gguf_str s) { putchar('x'); for (uint64_t i = 0; i < s.len; i++) printf("%02x", (unsigned char)s.ptr[i]); }
int main(int argc, char **argv) {
    struct mapped_file m; char err[ERR_BUF]; struct gguf_file *g;
    if (map_open(argv[1], &m, err, sizeof err)) { printf("error %s\n", err); return 1; }
    if (gguf_parse(m.data, m.size, argv[1], &g, err, sizeof err)) { printf("error %s\n", err); return 1; }
    printf("version %u\n", gguf_version(g));
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k = gguf_key_name(g, i);
        char key[512]; snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        enum gguf_vtype t = gguf_kv_type(g, i);
        printf("kv %s %d", key, (int)t);
        int64_t v; double f; struct gguf_str s; enum gguf_vtype et; uint64_t n;
        if (t == GGUF_STRING && !gguf_get_str(g, key, &s, err, sizeof err)) { putchar(' '); hex(s); }
        else if ((t == GGUF_FLOAT32 || t == GGUF_FLOAT64) && !gguf_get_float(g, key, &f, err, sizeof err)) printf(" %.17g", f);
        else if (t == GGUF_ARRAY && !gguf_get_arr(g, key, &et, &n, err, sizeof err)) {
            printf(" %d %llu", (int)et, (unsigned long long)n);
            for (uint64_t j = 0; j < n; j++) {
                if (et == GGUF_STRING) { putchar(' '); hex(gguf_arr_str(g, key, j)); }
                else if (et == GGUF_FLOAT32 || et == GGUF_FLOAT64) printf(" %.17g", gguf_arr_float(g, key, j));
                else if (et != GGUF_ARRAY) printf(" %lld", (long long)gguf_arr_int(g, key, j));
            }
        } else if (!gguf_get_int(g, key, &v, err, sizeof err)) printf(" %lld", (long long)v);
        putchar('\n');
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct tensor *t = gguf_tensor(g, i);
        printf("tensor %s %d %d %lld %lld %lld %lld %td %zu\n", t->name, (int)t->type, t->n_dims,
               (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
               (const uint8_t *)t->data - m.data, t->nbytes);
    }
    gguf_free(g); map_close(&m); return 0;
}
"""


@pytest.fixture(scope="module")
def dumper(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "no C compiler (scripts/install-deps.sh installs gcc)"
    d = tmp_path_factory.mktemp("gguf_dump")
    (d / "dump.c").write_text(DUMPER)
    src = ROOT / "src"
    subprocess.run([cc, "-std=c11", "-O1", "-D_POSIX_C_SOURCE=200809L", f"-I{src}", str(d / "dump.c"),
                    str(src / "loader/gguf.c"), str(src / "util/err.c"), str(src / "util/tensor.c"),
                    str(src / "util/mapfile.c"), "-o", str(d / "dump")], check=True)
    return d / "dump"


def dump(dumper, path):
    out = subprocess.run([str(dumper), str(path)], capture_output=True, text=True)
    kvs, tensors, version = {}, {}, None
    for line in out.stdout.splitlines():
        f = line.split(" ")
        if f[0] == "error":
            return line
        if f[0] == "version":
            version = int(f[1])
        elif f[0] == "kv":
            kvs[f[1]] = (int(f[2]), f[3:])
        elif f[0] == "tensor":
            tensors[f[1]] = tuple(int(x) for x in f[2:])
    assert out.returncode == 0, out.stdout + out.stderr
    return version, kvs, tensors


def parse_scalar(tok):
    if tok.startswith("x"):
        return bytes.fromhex(tok[1:])
    return float(tok) if any(c in tok for c in ".en") else int(tok)


def check_against_reader(path, kvs, tensors):
    """Every field and tensor gguf-py reads, our parser reports identically."""
    r = gguf.GGUFReader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(fields) == set(kvs)
    for key, f in fields.items():
        vtype, vals = kvs[key]
        assert vtype == int(f.types[0]), key
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            assert int(vals[0]) == int(f.types[1]), key
            if f.types[1] == gguf.GGUFValueType.ARRAY:
                continue  # gguf-py flattens nested arrays; the caller checks these
            assert int(vals[1]) == len(f.data), key
            got = [parse_scalar(t) for t in vals[2:]]
            want = [bytes(f.parts[i]) if f.types[1] == gguf.GGUFValueType.STRING else f.parts[i][0].item()
                    for i in f.data]
        else:
            got = [parse_scalar(t) for t in vals]
            want = [bytes(f.parts[-1]) if f.types[0] == gguf.GGUFValueType.STRING else f.parts[-1][0].item()]
        for g_, w_ in zip(got, want):
            if isinstance(w_, bool):
                w_ = int(w_)
            if isinstance(w_, float):
                assert math.isclose(g_, w_, rel_tol=1e-7) or (math.isnan(g_) and math.isnan(w_)), key
            else:
                assert g_ == w_, key
        assert len(got) == len(want), key
    assert set(tensors) == {t.name for t in r.tensors}
    for t in r.tensors:
        ttype, n_dims, *ne, data_off, nbytes = tensors[t.name]
        assert ttype == int(t.tensor_type), t.name
        assert n_dims == len(t.shape) and ne[:n_dims] == [int(x) for x in t.shape], t.name
        assert data_off == t.data_offset and nbytes == t.n_bytes, t.name


@pytest.mark.parametrize("alignment", [None, 64])
def test_gguf_py_written_file(dumper, tmp_path, alignment):
    path = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("v.u8", 250)
    w.add_int8("v.i8", -7)
    w.add_uint16("v.u16", 60000)
    w.add_int16("v.i16", -30000)
    w.add_uint32("v.u32", 4000000000)
    w.add_int32("v.i32", -2000000000)
    w.add_float32("v.f32", 0.1)
    w.add_bool("v.bool", True)
    w.add_string("v.str", "h\u00e9llo \u2603")
    w.add_uint64("v.u64", 2**63 - 1)
    w.add_int64("v.i64", -(2**62))
    w.add_float64("v.f64", 1e-300)
    w.add_array("v.strs", ["a", "", "\u20ac", "tail"])
    w.add_array("v.ints", [1, -2, 3])
    w.add_array("v.floats", [0.5, -1.25])
    w.add_array("v.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    Q = gguf.GGMLQuantizationType
    for name, qt, blocks, rows in [("q8_0", Q.Q8_0, 2, 3), ("q4_0", Q.Q4_0, 1, 2), ("q4_1", Q.Q4_1, 3, 1),
                                   ("q5_0", Q.Q5_0, 1, 1), ("q5_1", Q.Q5_1, 2, 2), ("q4_k", Q.Q4_K, 1, 2),
                                   ("q6_k", Q.Q6_K, 2, 1), ("bf16", Q.BF16, 5, 1)]:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor(name, rng.integers(0, 255, (rows, blocks * ts), dtype=np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    version, kvs, tensors = dump(dumper, path)
    assert version == 3
    assert len(tensors) == 10
    assert kvs["v.nested"] == (9, ["9", "2"])  # an array of 2 arrays, elements not exposed
    check_against_reader(path, kvs, tensors)


def test_default_model_matches_gguf_py(dumper):
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"{DEFAULT_MODEL} missing: run make model")
    version, kvs, tensors = dump(dumper, DEFAULT_MODEL)
    assert version == 3 and len(tensors) == 272
    check_against_reader(DEFAULT_MODEL, kvs, tensors)


def test_truncated_model_header_refused(dumper, tmp_path):
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"{DEFAULT_MODEL} missing: run make model")
    path = tmp_path / "cut.gguf"
    path.write_bytes(DEFAULT_MODEL.read_bytes()[:1_000_000])
    out = dump(dumper, path)
    assert isinstance(out, str) and out.startswith("error ") and "cut.gguf" in out
