//! A scaling activity's `Cause` (AWS's text, any bytes a compromised or changed API
//! could send): classifying it never panics and reads at most its bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = ca_asg_provider::scalein::decide::budget::asg_cause::classify(&text);
    let _ = ca_asg_provider::cloud::bounded_cause(&text);
    let _ = ca_asg_provider::cloud::terminated_by(&text);
});
