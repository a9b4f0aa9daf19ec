#!/usr/bin/env bash
# Tokenizer encode throughput on one core: tessera vs Hugging Face `tokenizers`, side by
# side on the same generated mixed corpus (English, code, CJK, emoji, numbers,
# whitespace) cut into the same 4 KiB chunks. Prints one table row per tokenizer.
# The tokenizer.json files are the reference data of scripts/get-testdata.py (fetched here
# when missing). Environment: BUILD (default build), SECONDS_PER_RUN (default 3), CHUNK
# (default 4096), TESSERA_TESTDATA (default build/testdata).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TOOL=${TOOL:-$BUILD/tests/tool_bench_tokenizer}
TESTDATA=${TESSERA_TESTDATA:-build/testdata}
SECS=${SECONDS_PER_RUN:-3}
CHUNK=${CHUNK:-4096}
PY=.venv/bin/python
[ -f "$TESTDATA/.ok" ] || $PY scripts/get-testdata.py --out "$TESTDATA"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# A deterministic ~2 MB mixed corpus.
$PY - "$WORK/corpus.txt" <<'PYEOF'
import pathlib, random, sys
rng = random.Random(1234)
words = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their can has more been would if what when so no out up into "
         "model token server request latency throughput memory kernel cache don't it's we'll they're I'm").split()
cjk = "你好世界今天天气很好我们去公园散步吧中文文本处理需要分词こんにちは世界カタカナひらがな漢字안녕하세요세계한국어"
emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸", "❤️", "🚀", "✨"]
code = "\n".join(p.read_text(errors="replace") for p in sorted(pathlib.Path("src").rglob("*.c"))[:40])
parts = []
size = 0
while size < 2_000_000:
    r = rng.random()
    if r < 0.40:
        s = " ".join(rng.choice(words) for _ in range(rng.randint(20, 80)))
        s = s.capitalize() + rng.choice([". ", "! ", "? ", ".\n\n"])
    elif r < 0.65:
        i = rng.randrange(0, max(1, len(code) - 3000))
        s = code[i:i + rng.randint(500, 3000)]
    elif r < 0.80:
        s = "".join(rng.choice(cjk) for _ in range(rng.randint(20, 200))) + "。\n"
    elif r < 0.90:
        s = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(30)) + "\n\t  \r\n"
    else:
        s = " ".join(rng.choice(words) + rng.choice(emoji) for _ in range(20)) + "\n"
    parts.append(s)
    size += len(s.encode())
pathlib.Path(sys.argv[1]).write_text("".join(parts), encoding="utf-8")
PYEOF

hf_bench() { # tokenizer.json corpus -> "load ... MB/s" line like the C tool
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false $PY - "$1" "$2" "$CHUNK" "$SECS" <<'PYEOF'
import sys, time
from tokenizers import Tokenizer
path, corpus, chunk, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
t0 = time.perf_counter(); tok = Tokenizer.from_file(path); load = time.perf_counter() - t0
data = open(corpus, "rb").read()
chunks, off = [], 0
while off < len(data):
    n = min(chunk, len(data) - off)
    while off + n < len(data) and (data[off + n] & 0xC0) == 0x80:
        n += 1
    chunks.append(data[off:off + n].decode()); off += n
b = t = 0; passes = 0; t0 = time.perf_counter()
while True:
    for c in chunks:
        t += len(tok.encode(c, add_special_tokens=False).ids)
    b += len(data); passes += 1
    if time.perf_counter() - t0 >= secs:
        break
dt = time.perf_counter() - t0
print(f"load {load:.3f} s  encode {b / dt / 1e6:.2f} MB/s  {t / dt:.0f} tokens/s  {b / t:.2f} bytes/token")
PYEOF
}

printf '%-12s %-8s %s\n' tokenizer impl result
for name in llama3 qwen3 deepseek_r1; do
    json=$TESTDATA/tokenizers/$name/tokenizer.json
    printf '%-12s %-8s %s\n' "$name" tessera "$("$TOOL" "$json" "$WORK/corpus.txt" "$CHUNK" "$SECS")"
    printf '%-12s %-8s %s\n' "$name" hf "$(hf_bench "$json" "$WORK/corpus.txt")"
done
if [ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    printf '%-12s %-8s %s\n' smollm2-gguf tessera \
        "$("$TOOL" models/SmolLM2-135M-Instruct.Q4_1.gguf "$WORK/corpus.txt" "$CHUNK" "$SECS")"
    $PY tests/python/gguf_tokenizer.py models/SmolLM2-135M-Instruct.Q4_1.gguf "$WORK/smol/tokenizer.json"
    printf '%-12s %-8s %s\n' smollm2-gguf hf "$(hf_bench "$WORK/smol/tokenizer.json" "$WORK/corpus.txt")"
fi
