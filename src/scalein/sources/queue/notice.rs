//! What a queue message says, in the shapes AWS sends: EventBridge envelopes (spot
//! interruption, rebalance recommendation, AWS Health scheduled change, instance
//! state change, the ASG's terminate lifecycle action), the ASG's own lifecycle
//! notification and its test notification, and any of those wrapped in an SNS
//! envelope, parsed into a [`Notice`]. Pure; bounded; never panics (fuzzed:
//! `fuzz/fuzz_targets/queue_notice.rs`).

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::cloud::LifecycleAction;
use crate::scalein::decide::notice::Notice;

/// Parses a message body. `Err` names what is wrong: the message is poison (it will
/// never parse) and is deleted, not retried.
pub fn parse(body: &str) -> Result<Notice, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    // SNS delivers the event as a string in `Message`.
    if v["Type"] == "Notification" {
        let inner = v["Message"]
            .as_str()
            .ok_or("SNS envelope without a string Message")?;
        return parse(inner);
    }
    if let Some(detail_type) = v.get("detail-type") {
        let detail_type = detail_type.as_str().ok_or("detail-type is not a string")?;
        return eventbridge(detail_type, &v);
    }
    if v.get("LifecycleTransition").is_some() || v.get("Event").is_some() {
        return asg_notification(&v);
    }
    Err("neither an EventBridge event nor an Auto Scaling notification".into())
}

fn text<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    match v.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(other) => Err(format!("{field} is not a non-empty string: {other}")),
        None => Err(format!("{field} is missing")),
    }
}

fn instance(v: &Value, field: &str) -> Result<String, String> {
    let id = text(v, field)?;
    if !id.starts_with("i-") || id.len() > 32 || !id[2..].chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Err(format!("{field} {id:?} is not an EC2 instance id"));
    }
    Ok(id.to_string())
}

fn time(v: &Value, field: &str) -> Option<DateTime<Utc>> {
    let s = v.get(field)?.as_str()?;
    DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_rfc2822(s))
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn eventbridge(detail_type: &str, v: &Value) -> Result<Notice, String> {
    let d = v
        .get("detail")
        .filter(|d| d.is_object())
        .ok_or("detail is missing")?;
    let at = time(v, "time");
    match detail_type {
        "EC2 Spot Instance Interruption Warning" => Ok(Notice::Spot {
            instance_id: instance(d, "instance-id")?,
            time: at,
        }),
        "EC2 Instance Rebalance Recommendation" => Ok(Notice::Rebalance {
            instance_id: instance(d, "instance-id")?,
            time: at,
        }),
        "EC2 Instance State-change Notification" => Ok(Notice::StateChange {
            instance_id: instance(d, "instance-id")?,
            state: text(d, "state")?.to_string(),
            time: at,
        }),
        "EC2 Instance-terminate Lifecycle Action" => lifecycle(d, at),
        "EC2 Instance-launch Lifecycle Action" => {
            Ok(Notice::Nothing("a launch lifecycle action".into()))
        }
        "AWS Health Event" => {
            let category = d["eventTypeCategory"].as_str().unwrap_or_default();
            let service = d["service"].as_str().unwrap_or_default();
            if category != "scheduledChange" || service != "EC2" {
                return Ok(Notice::Nothing(format!(
                    "an AWS Health event of category {category:?} for service {service:?}"
                )));
            }
            let entities = d["affectedEntities"]
                .as_array()
                .ok_or("affectedEntities is missing")?;
            let mut ids = Vec::new();
            for e in entities {
                ids.push(instance(e, "entityValue")?);
            }
            if ids.is_empty() {
                return Err("affectedEntities is empty".into());
            }
            Ok(Notice::Scheduled {
                instance_ids: ids,
                event_type: text(d, "eventTypeCode")?.to_string(),
                start: time(d, "startTime"),
                time: at,
            })
        }
        other => Ok(Notice::Nothing(format!("an event of type {other:?}"))),
    }
}

/// The ASG's notification (a hook's notification target), or EventBridge's detail,
/// which carries the same fields.
fn asg_notification(v: &Value) -> Result<Notice, String> {
    if v["Event"] == "autoscaling:TEST_NOTIFICATION" {
        return Ok(Notice::Nothing(format!(
            "the Auto Scaling test notification of group {}",
            v["AutoScalingGroupName"].as_str().unwrap_or("?")
        )));
    }
    lifecycle(v, time(v, "Time"))
}

fn lifecycle(d: &Value, at: Option<DateTime<Utc>>) -> Result<Notice, String> {
    match text(d, "LifecycleTransition")? {
        "autoscaling:EC2_INSTANCE_TERMINATING" => Ok(Notice::LifecycleTerminate {
            action: LifecycleAction {
                group: text(d, "AutoScalingGroupName")?.to_string(),
                hook: text(d, "LifecycleHookName")?.to_string(),
                instance_id: instance(d, "EC2InstanceId")?,
                token: d["LifecycleActionToken"].as_str().map(str::to_string),
            },
            time: at,
        }),
        "autoscaling:EC2_INSTANCE_LAUNCHING" => {
            Ok(Notice::Nothing("a launch lifecycle action".into()))
        }
        other => Err(format!("LifecycleTransition {other:?} is unknown")),
    }
}

#[cfg(test)]
mod tests;
