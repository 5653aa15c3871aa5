#!/usr/bin/env bash
# Mutation testing of the drain's decisions (cargo-mutants): every mutant of the pure
# decision files is built and judged by the library's unit tests; the mutants those
# miss are judged again by the integration tests that drive the same code through the
# service. CI does not run it (hours on 2 cores); docs/mutants.md has the last
# run's counts and a reason for every mutant that survives.
#
#   scripts/mutants.sh                  # pass 1 over every file below
#   MUTANTS_SERVICE=1 scripts/mutants.sh   # and pass 2 (minutes per survivor)
#   scripts/mutants.sh --file src/scalein/decide/notice.rs   # one file
#
# Results go to $MUTANTS_OUT (default ~/.cache/ca-asg-provider/mutants), outside
# the tree: lib/mutants.out (first pass) and service/mutants.out (second pass), each
# with caught.txt, missed.txt, timeout.txt, unviable.txt.
# Extra arguments go to cargo-mutants (e.g. --in-place in a scratch worktree).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo mutants --version >/dev/null 2>&1; then
    echo "== installing cargo-mutants"
    cargo install --locked cargo-mutants
fi

FILES=(
    src/scalein/decide/plan.rs
    src/scalein/decide/record.rs
    src/scalein/kube/budgets.rs
    src/scalein/decide/notice.rs
    src/provider/sizes.rs
)
# The integration tests that drive these decisions through the service.
SERVICE_TESTS=(
    --lib --test reasons --test scalein --test scalein_unkind --test scalein_safety
    --test interruption --test accounting_model --test grpc_api --test managed_node_groups
)

out="${MUTANTS_OUT:-$HOME/.cache/ca-asg-provider/mutants}"
mkdir -p "$out"
file_args=()
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --file) file_args+=(--file "$2"); shift 2 ;;
        *) extra+=("$1"); shift ;;
    esac
done
if [ ${#file_args[@]} -eq 0 ]; then
    for f in "${FILES[@]}"; do file_args+=(--file "$f"); done
fi

echo "== pass 1: every mutant against the library's unit tests"
cargo mutants "${file_args[@]}" --no-shuffle --timeout 120 --build-timeout 900 \
    --output "$out/lib" --cargo-arg=--lib "${extra[@]}" || true

missed="$out/lib/mutants.out/missed.txt"
if [ ! -s "$missed" ]; then
    echo "== no mutant survived the unit tests"
    exit 0
fi
if [ "${MUTANTS_SERVICE:-0}" != 1 ]; then
    printf 'lib      caught %4s  missed %4s  timeout %4s  unviable %4s\n' \
        "$(wc -l <"$out/lib/mutants.out/caught.txt")" "$(wc -l <"$missed")" \
        "$(wc -l <"$out/lib/mutants.out/timeout.txt")" "$(wc -l <"$out/lib/mutants.out/unviable.txt")"
    echo "survivors: $missed (MUTANTS_SERVICE=1 judges them again by the integration tests)"
    exit 0
fi
# One regex that matches exactly the survivors' names.
re="$(python3 - "$missed" <<'PY'
import re, sys
names = [l.strip() for l in open(sys.argv[1]) if l.strip()]
print("^(" + "|".join(re.escape(n) for n in names) + ")$")
PY
)"
echo "== pass 2: the $(wc -l <"$missed") survivors against the service's integration tests"
test_args=()
for a in "${SERVICE_TESTS[@]}"; do test_args+=("--cargo-arg=$a"); done
cargo mutants "${file_args[@]}" --no-shuffle --re "$re" --timeout 600 --build-timeout 900 \
    --output "$out/service" "${test_args[@]}" "${extra[@]}" || true

for pass in lib service; do
    d="$out/$pass/mutants.out"
    [ -d "$d" ] || continue
    printf '%-8s caught %4s  missed %4s  timeout %4s  unviable %4s\n' "$pass" \
        "$(wc -l <"$d/caught.txt")" "$(wc -l <"$d/missed.txt")" \
        "$(wc -l <"$d/timeout.txt")" "$(wc -l <"$d/unviable.txt")"
done
echo "survivors: $out/service/mutants.out/missed.txt"
