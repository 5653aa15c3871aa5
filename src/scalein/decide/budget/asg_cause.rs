//! The Auto Scaling group's own cause of a scale-in our hook holds, as its scaling
//! activity states it (DescribeScalingActivities: the activity `Terminating EC2
//! instance: i-...` and its `Cause`), so that a budget can tell an instance refresh
//! from a scaling policy or a person. Pure: the text comes in already read.
//!
//! The `Cause` reads "At TIME an instance was taken out of service in response to
//! WHY." (or "instance i-... was taken out of service ..."), often after what
//! changed the desired capacity. What follows "in response to" decides:
//!
//! | "in response to ..."                                   | cause                  |
//! |--------------------------------------------------------|------------------------|
//! | "an instance refresh"                                  | `asg-instance-refresh` |
//! | "a difference between desired and actual capacity"     | `asg-scaling` (a policy, a schedule, a person setting the desired capacity) |
//! | "a user request" (TerminateInstanceInAutoScalingGroup) | `asg-person`           |
//! | words with "rebalanc" (Availability Zones)              | `asg-az-rebalance`     |
//! | words with "lifetime" (maximum instance lifetime)       | `asg-max-lifetime`     |
//! | anything else (health checks, a phrase AWS adds later), or no such clause | `asg-other` |
//!
//! The first three are AWS's documented phrasings; the rebalance and lifetime ones
//! are matched by a word, as their exact phrasing is not documented. Only the first
//! [`MAX_CAUSE`] bytes are read (a cause is a sentence or three).

use super::{Budget, Cause};

/// At most this much of a `Cause` is read.
pub const MAX_CAUSE: usize = 4096;

/// The ASG's causes a budget may list (`asg` stands for all of them).
pub const ASG_CAUSES: [Cause; 6] = [
    Cause::AsgScaling,
    Cause::AsgInstanceRefresh,
    Cause::AsgAzRebalance,
    Cause::AsgMaxLifetime,
    Cause::AsgPerson,
    Cause::AsgOther,
];

/// The cause a scaling activity's `Cause` text states.
pub fn classify(text: &str) -> Cause {
    let mut end = text.len().min(MAX_CAUSE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let lower = text[..end].to_ascii_lowercase();
    // The clause of the termination itself: the last "out of service in response
    // to" (what changed the desired capacity comes before it).
    let Some(at) = lower.rfind("out of service in response to") else {
        return Cause::AsgOther;
    };
    let why = &lower[at + "out of service in response to".len()..];
    let why = why.split(". ").next().unwrap_or(why);
    if why.contains("instance refresh") {
        Cause::AsgInstanceRefresh
    } else if why.contains("difference between desired and actual capacity") {
        Cause::AsgScaling
    } else if why.contains("user request") {
        Cause::AsgPerson
    } else if why.contains("rebalanc") {
        Cause::AsgAzRebalance
    } else if why.contains("lifetime") {
        Cause::AsgMaxLifetime
    } else {
        Cause::AsgOther
    }
}

/// Whether some budget lists some of the ASG's causes and not all of them: only
/// then is a scale-in's own cause asked of AWS (one DescribeScalingActivities walk
/// per held instance).
pub fn tells_apart(budgets: &[Budget]) -> bool {
    budgets.iter().any(|b| {
        b.causes.as_ref().is_some_and(|c| {
            let listed = ASG_CAUSES.iter().filter(|a| c.contains(a)).count();
            listed > 0 && listed < ASG_CAUSES.len()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phrase_names_its_cause() {
        let cases = [
            ("At 2026-03-02T08:00:05Z an instance was taken out of service in response to an instance refresh.  At 2026-03-02T08:00:05Z instance i-0a1b2c3d4e5f60718 was selected for termination.", Cause::AsgInstanceRefresh),
            ("At 2026-03-02T09:10:00Z a monitor alarm web-low-cpu in state ALARM triggered policy web-scale-in changing the desired capacity from 6 to 5. At 2026-03-02T09:10:09Z an instance was taken out of service in response to a difference between desired and actual capacity, shrinking the capacity from 6 to 5.", Cause::AsgScaling),
            // A person lowering the desired capacity is a scaling, not a terminate.
            ("At 2026-03-02T10:00:00Z a user request update of AutoScalingGroup constraints to min: 1, max: 9, desired: 2 changing the desired capacity from 3 to 2.  At 2026-03-02T10:00:01Z an instance was taken out of service in response to a difference between desired and actual capacity, shrinking the capacity from 3 to 2.", Cause::AsgScaling),
            ("At 2026-03-02T11:00:00Z instance i-0f0e0d0c0b0a09080 was taken out of service in response to a user request, shrinking the capacity from 5 to 4.", Cause::AsgPerson),
            ("At 2026-03-02T11:05:00Z instance i-0f0e0d0c0b0a09081 was taken out of service in response to a user request.", Cause::AsgPerson),
            ("At 2026-01-01T00:00:00Z an instance was taken out of service in response to an Availability Zone rebalancing.", Cause::AsgAzRebalance),
            ("At 2026-01-01T00:00:00Z an instance was taken out of service in response to the instance reaching its maximum instance lifetime.", Cause::AsgMaxLifetime),
            ("At 2026-03-02T12:00:00Z an instance was taken out of service in response to an ELB system health check failure.", Cause::AsgOther),
            ("At 2026-03-02T12:30:00Z an instance was taken out of service in response to an EC2 health check indicating it has been terminated or stopped.", Cause::AsgOther),
            ("", Cause::AsgOther),
            ("something else entirely", Cause::AsgOther),
        ];
        for (text, want) in cases {
            assert_eq!(classify(text), want, "{text}");
        }
    }

    #[test]
    fn only_the_termination_clause_decides() {
        // A refresh mentioned before the clause does not make a scaling a refresh.
        let t = "After an instance refresh was cancelled, at 2026-01-01T00:00:00Z an instance was taken out of service in response to a difference between desired and actual capacity.";
        assert_eq!(classify(t), Cause::AsgScaling);
        // Past the bound nothing is read.
        let long = format!(
            "{}an instance was taken out of service in response to an instance refresh.",
            "x".repeat(MAX_CAUSE)
        );
        assert_eq!(classify(&long), Cause::AsgOther);
        // Multi-byte text at the bound does not split a character.
        let wide = format!("{}é in response to", "a".repeat(MAX_CAUSE - 1));
        assert_eq!(classify(&wide), Cause::AsgOther);
    }

    proptest::proptest! {
        /// Whatever AWS (or something in its place) sends: no panic, and text past
        /// the bound changes nothing.
        #[test]
        fn any_text_classifies_and_only_its_head_counts(head in ".{0,300}", tail in ".{0,300}") {
            let _ = classify(&head);
            let mut padded = head.clone();
            while padded.len() < MAX_CAUSE {
                padded.push(' ');
            }
            let with_tail = format!("{padded}{tail}");
            proptest::prop_assert_eq!(classify(&with_tail), classify(&padded));
        }
    }

    #[test]
    fn causes_are_asked_for_only_when_a_budget_tells_them_apart() {
        let with = |c: Option<&[Cause]>| Budget {
            causes: c.map(|c| c.iter().copied().collect()),
            ..Budget::always("b", super::super::Nodes::Count(1))
        };
        assert!(!tells_apart(&[]));
        assert!(!tells_apart(&[with(None)]));
        assert!(!tells_apart(&[with(Some(&ASG_CAUSES))]));
        assert!(!tells_apart(&[with(Some(&[Cause::CaEmpty]))]));
        assert!(tells_apart(&[with(Some(&[Cause::AsgInstanceRefresh]))]));
        assert!(tells_apart(&[
            with(Some(&ASG_CAUSES)),
            with(Some(&[Cause::AsgOther, Cause::CaEmpty]))
        ]));
    }
}
