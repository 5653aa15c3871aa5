//! Preconditions a write names, checked as the API server checks them; shared by
//! plain deletes ([`super::http`]) and evictions ([`super::eviction`]).

use serde_json::Value;

use super::store::ApiError;

/// A delete (or eviction) naming the UID it means fails with 409 when the object
/// by that name is another one, as the API server checks `preconditions.uid`.
pub(crate) fn check_uid_precondition(obj: &Value, preconditions: &Value) -> Result<(), ApiError> {
    let Some(want) = preconditions["uid"].as_str() else {
        return Ok(());
    };
    let have = obj["metadata"]["uid"].as_str().unwrap_or("");
    if want == have {
        return Ok(());
    }
    Err(ApiError::new(
        409,
        "Conflict",
        format!("Precondition failed: UID in precondition: {want}, UID in object meta: {have}"),
    ))
}
