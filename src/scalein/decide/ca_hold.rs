//! Telling cluster-autoscaler before it picks: which nodes CA's scale-down may not
//! choose now, because a disruption budget would hold the drain CA's DeleteNodes
//! asks for, and what to write on a Node so CA knows.
//!
//! CA skips, at every loop, a node whose annotation
//! [`SCALE_DOWN_DISABLED`] is `"true"` (docs/scale-in.md names where, per version).
//! The service sets it on the nodes [`held`] names, with [`HELD_BY`] as its mark of
//! ownership, and removes both once the node is no longer held. The rule:
//!
//! 1. A node is held when the drain CA's scale-in of it would become waits: the
//!    same verdict the gate gives a drain ([`budget::verdict`]), for a drain of the
//!    node's place with CA's causes, not exempt. So a budget governing CA's
//!    causes that is in force and closed (`nodes: 0` in its window), has no room
//!    left, or whose rate has no start left, holds every node it covers.
//! 2. Empty or occupied: a budget that governs only one of CA's two causes decides
//!    per node by whether it runs workload pods. When that is not known the node
//!    counts as both, so either budget holds it: the mistake this side can make is
//!    a node CA could have removed staying (CA removes another, or waits), never a
//!    node CA picks whose drain then waits cordoned for the budget.
//! 3. What to write ([`change`]) never touches an annotation an operator set: the
//!    annotation without our mark is not ours, whatever its value, and is neither
//!    taken over nor removed; only a node carrying our mark is released.

use std::collections::BTreeMap;

use super::budget::{self, Budget, Cause, Drain, Place, Verdict, World};

/// The annotation CA reads: `"true"` keeps the node out of its scale-down.
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Our mark of ownership beside it: the budget that holds the node from CA.
pub const HELD_BY: &str = "ca-asg-provider.io/scale-down-held-by";

/// A node CA could pick: its name, where it is, and whether it runs no workload
/// pod (`None`: not known, rule 2).
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub node: &'a str,
    pub place: Place<'a>,
    pub empty: Option<bool>,
}

/// Rule 1 and 2: each held node, with the budget (the first, in the order given)
/// that holds it.
pub fn held(
    budgets: &[Budget],
    world: &World<'_>,
    candidates: &[Candidate<'_>],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for c in candidates {
        let causes = ca_causes(c.empty);
        let drain = Drain {
            place: c.place,
            causes,
            exempt: false,
        };
        if let Verdict::Wait(hold) = budget::verdict(budgets, &drain, world) {
            out.insert(c.node.to_string(), hold.budget);
        }
    }
    out
}

/// CA's causes for a node: empty, occupied, or both when not known.
fn ca_causes(empty: Option<bool>) -> &'static [Cause] {
    match empty {
        Some(true) => &[Cause::CaEmpty],
        Some(false) => &[Cause::CaOccupied],
        None => &[Cause::CaEmpty, Cause::CaOccupied],
    }
}

/// Whether any budget decides CA's scale-in per node by its pods (governs one of
/// CA's causes and not the other): only then are the pods read.
pub fn tells_empty_from_occupied(budgets: &[Budget]) -> bool {
    budgets.iter().any(|b| {
        b.causes
            .as_ref()
            .is_some_and(|c| c.contains(&Cause::CaEmpty) != c.contains(&Cause::CaOccupied))
    })
}

/// A write to a Node's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Set [`SCALE_DOWN_DISABLED`] to `"true"` and our mark to this budget.
    Hold(String),
    /// Remove both.
    Release,
}

impl Change {
    /// The merge patch of the Node's annotations.
    pub fn patch(&self) -> serde_json::Value {
        match self {
            Change::Hold(budget) => serde_json::json!({"metadata": {"annotations": {
                SCALE_DOWN_DISABLED: "true",
                HELD_BY: budget,
            }}}),
            Change::Release => serde_json::json!({"metadata": {"annotations": {
                SCALE_DOWN_DISABLED: null,
                HELD_BY: null,
            }}}),
        }
    }
}

/// Rule 3: what to write on a Node whose annotations are `annotations` when
/// `want` is the budget that holds it now (`None`: not held). `None`: nothing,
/// the Node already says it (only transitions are written) or it is not ours.
pub fn change(annotations: &BTreeMap<String, String>, want: Option<&str>) -> Option<Change> {
    let ours = annotations.get(HELD_BY);
    let disabled = annotations.get(SCALE_DOWN_DISABLED);
    match (want, ours) {
        (Some(b), Some(mark)) if mark == b && disabled.is_some_and(|v| v == "true") => None,
        // An operator's annotation (any value): not ours to take over.
        (Some(_), None) if disabled.is_some() => None,
        (Some(b), _) => Some(Change::Hold(b.to_string())),
        (None, Some(_)) => Some(Change::Release),
        (None, None) => None,
    }
}

/// Whether a Node carries our mark (`undrain --all` releases those).
pub fn is_ours(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(HELD_BY)
}

#[cfg(test)]
mod tests;
