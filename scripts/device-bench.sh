#!/usr/bin/env bash
# The thread-scaling table (build/bench/bench_threads) on a machine that has
# no compiler and no packages: a many-core host lent for a few minutes.
#
#   scripts/device-bench.sh pack [DIR]   here: build and gather into DIR (default .devbench)
#   DIR/run.sh [SHAPE]                   there: the table, tokpipe beside llama.cpp
#
# pack builds tokpipe's programs and a llama-bench from the same llama.cpp
# source the bench builds (build/llamacpp/COMMIT/src: run bench_threads here
# once first), but built as llama.cpp's own release binaries are
# (GGML_BACKEND_DL with every x86 CPU variant, the best one picked at run
# time), not -march=native: a native build of this machine would be a weak
# baseline on a wider CPU. It copies the programs, every shared library they
# load, the dynamic loader and the GGUF vocabulary into DIR, so nothing of
# the host is used but its kernel; each program runs through the carried
# loader (DIR/bin holds wrappers).
#
# run.sh takes $TP_BENCH_TYPES (default Q8_0,Q4_K_M), $TP_BENCH_THREADS
# (default 1,2,4,8,16 capped at the CPUs), $TP_BENCH_TOKENS (default 32) and
# SHAPE (default 2048x22x32x4, TinyLlama 1.1B's layout with llama2.c's hidden
# size), writes the table to stdout and, when $OUT is set, to
# $OUT/bench_threads.txt. A 1.1B model's five samples per cell take about
# five minutes on 16 cores.
set -euo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }

[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in
-h | --help) usage; exit 0 ;;
pack) ;;
*) echo "device-bench.sh: unknown command '$1' (pack)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${2:-.devbench}
models=${TP_MODELS:-../shared/models}
vocab="$models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"
[ -r "$vocab" ] || { echo "device-bench.sh: no $vocab (\$TP_MODELS)" >&2; exit 1; }

make -s bin/tokpipe build/bench/bench_threads

src=$(ls -d build/llamacpp/*/src 2>/dev/null | head -n 1 || true)
[ -n "$src" ] || {
    echo "device-bench.sh: no llama.cpp source under build/llamacpp: run build/bench/bench_threads once" >&2
    exit 1
}
tree=$(dirname "$src")
commit=$(git -C "$src" rev-parse HEAD)
flags="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"
if [ ! -e "$tree/build-dl/.complete" ]; then
    echo "device-bench.sh: building llama-bench with every CPU variant (long, once): $tree/build-dl.log" >&2
    # the variants are llama.cpp's own list, as its configured build names them
    { cmake -S "$src" -B "$tree/build-dl" $flags -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
          -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF &&
          variants=$(cmake --build "$tree/build-dl" --target help | grep -o 'ggml-cpu-[a-z0-9_]*' | sort -u) &&
          [ -n "$variants" ] &&
          cmake --build "$tree/build-dl" --config Release -j "$(nproc)" --target llama-bench $variants &&
          touch "$tree/build-dl/.complete"; } \
        >"$tree/build-dl.log" 2>&1 || { tail -n 20 "$tree/build-dl.log" >&2; exit 1; }
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/real" "$out/lib" "$out/models/llama.cpp-vocab"
cp build/bench/bench_threads bin/tokpipe "$tree/build-dl/bin/llama-bench" "$out/real/"
strip "$out/real/"* 2>/dev/null || true
# llama.cpp's libraries and CPU variants beside the loader (with the loader
# as the process image, llama.cpp looks for its backends in the loader's
# directory), each once, under the name it is loaded by: its soname link,
# or the file itself when it has none
for f in "$tree"/build-dl/bin/lib*.so*; do
    case "$(basename "$f")" in
    *.so) [ -L "$f" ] && continue ;;     # the link for linking against
    *.so.*.*) continue ;;                # the file behind a soname link
    esac
    cp -L "$f" "$out/lib/"
done
for p in "$out"/real/* "$out"/lib/*.so*; do
    LD_LIBRARY_PATH="$out/lib" ldd "$p" 2>/dev/null | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}'
done | sort -u | while read -r lib; do
    [ -e "$out/lib/$(basename "$lib")" ] || cp -L "$lib" "$out/lib/"
done
loader=$(basename "$(ls "$out"/lib/ld-linux-*.so.* | head -n 1)")
strip --strip-unneeded "$out"/lib/libggml* "$out"/lib/libllama* 2>/dev/null || true
cp "$vocab" "$out/models/llama.cpp-vocab/"
for p in tokpipe bench_threads llama-bench; do
    cat >"$out/bin/$p" <<EOF
#!/bin/sh
d=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$d/lib/$loader" --library-path "\$d/lib" "\$d/real/$p" "\$@"
EOF
    chmod +x "$out/bin/$p"
done
cat >"$out/run.sh" <<EOF
#!/bin/sh
# Made by scripts/device-bench.sh pack at tokpipe $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d).
set -eu
d=\$(cd "\$(dirname "\$0")" && pwd)
cpus=\$(nproc)
threads=""
for t in 1 2 4 8 16; do [ "\$t" -le "\$cpus" ] && threads="\$threads\${threads:+,}\$t"; done
case ",\$threads," in *",\$cpus,"*) ;; *) threads="\$threads,\$cpus" ;; esac
export BIN="\$d/bin" TP_MODELS="\$d/models" TMPDIR="\${TMPDIR:-/tmp}"
export TP_LLAMA_BENCH="\$d/bin/llama-bench" TP_LLAMA_COMMIT=$commit
export TP_LLAMA_BUILD="cmake $flags (llama.cpp's release build: the CPU's best variant)"
export TP_BENCH_TYPES="\${TP_BENCH_TYPES:-Q8_0,Q4_K_M}" TP_BENCH_THREADS="\${TP_BENCH_THREADS:-\$threads}"
export TP_BENCH_TOKENS="\${TP_BENCH_TOKENS:-32}"
shape="\${1:-2048x22x32x4}"
echo "device-bench: \$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), \$cpus CPUs; shape \$shape;" \
     "types \$TP_BENCH_TYPES; threads \$TP_BENCH_THREADS" >&2
if [ -n "\${OUT:-}" ]; then
    "\$d/bin/bench_threads" "\$shape" | tee "\$OUT/bench_threads.txt"
else
    "\$d/bin/bench_threads" "\$shape"
fi
EOF
chmod +x "$out/run.sh"
du -sh "$out"
echo "device-bench.sh: $out is ready; with the device tool: run(command=\"$out/run.sh\", carry=[\"$out\"])" >&2
