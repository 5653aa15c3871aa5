//! An interruption queue message body (EventBridge events, ASG lifecycle messages,
//! replayed or forged): parsing never panics, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = std::str::from_utf8(data) {
        let _ = ca_asg_provider::scalein::sources::queue::notice::parse(body);
    }
});
