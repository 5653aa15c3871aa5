//! A Unix socket client's bytes (the HTTP/2 preface, frames, HPACK header blocks, or
//! anything else), fed in chunks of any size: the rewrite never panics, and what it
//! hands on stays bounded by what came in (a rewritten block is re-encoded without
//! compression, so it may grow, but never past the block limit per block read).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte sets the chunk size, so the same bytes arrive cut many ways.
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(cut).max(1);
    let mut r = ca_asg_provider::h2_authority::Rewriter::default();
    let mut out = bytes::BytesMut::new();
    for piece in rest.chunks(chunk) {
        if r.feed(piece, &mut out).is_err() {
            break;
        }
    }
    assert!(out.len() <= rest.len() * 4 + 2 * ca_asg_provider::h2_authority::MAX_BLOCK);
});
