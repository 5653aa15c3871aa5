#!/usr/bin/env bash
# Fuzzes what the service reads back from outside with libFuzzer (cargo-fuzz, nightly):
#   drain_record  the drain record and marks on a Node's annotations (scalein::record)
#   queue_notice  an interruption queue message body (scalein::sources::queue::notice::parse)
#   h2_authority  a Unix socket client's HTTP/2 bytes, in any chunks (h2_authority::Rewriter)
#   user_data     launch-template user data (provider::template::userdata::parse)
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60). Installs cargo-fuzz when
# missing; needs the nightly toolchain (rustup toolchain install nightly). Not run by CI:
# the proptests of the same properties (src/scalein/decide/record/tests.rs `read_back`,
# src/scalein/sources/queue/notice/tests.rs `any_body`, src/h2_authority/tests.rs
# `any_bytes_in_any_reads_are_handed_on_unchanged_unless_rewritten`, src/provider/template/userdata.rs
# `any_user_data_parses_bounded`) run on every test run.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for target in drain_record queue_notice user_data h2_authority; do
    echo "== fuzz: $target for ${secs}s"
    cargo +nightly fuzz run "$target" -- -max_total_time="$secs" -print_final_stats=1
done
