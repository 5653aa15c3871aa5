//! A budget as seen from outside: the Ready, not terminating pods of an app, counted
//! from the fake API server's stream of pod changes (what happened to the pods), not
//! from its eviction verdicts or its disruption controller's status. A drain that
//! breaks a budget (an eviction past it, an instance ended under its pods) shows
//! here whatever the fake decided.

use std::collections::HashSet;
use std::sync::Arc;

use ca_asg_provider::sim::{store::EventType, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

#[derive(Debug, Default)]
struct Floor {
    /// UIDs of the app's healthy pods now.
    healthy: HashSet<String>,
    /// Reached `required` at least once (before that nothing can be broken).
    armed: bool,
    /// The fewest healthy pods seen once armed, and the change that left that few.
    lowest: Option<(usize, String)>,
    /// The change stream lagged: some changes were not seen, so the count is unknown.
    lagged: bool,
}

pub struct BudgetFloor {
    app: String,
    required: usize,
    state: Arc<parking_lot::Mutex<Floor>>,
    task: tokio::task::JoinHandle<()>,
}

fn healthy(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && !matches!(
            p["status"]["phase"].as_str(),
            Some("Succeeded") | Some("Failed")
        )
        && p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

impl BudgetFloor {
    /// Watches the pods labelled `app=<app>`, which a budget requires `required` of.
    pub fn watch(sim: &SimCluster, app: &str, required: usize) -> BudgetFloor {
        let mut rx = sim.store.subscribe();
        let mut f = Floor::default();
        // Seeded after subscribing: a change in between is seen twice, never missed.
        for p in sim.list::<Pod>() {
            if p["metadata"]["labels"]["app"] == app && healthy(&p) {
                f.healthy
                    .insert(p["metadata"]["uid"].as_str().unwrap_or("").to_string());
            }
        }
        f.armed = f.healthy.len() >= required;
        let state = Arc::new(parking_lot::Mutex::new(f));
        let (st, label) = (state.clone(), app.to_string());
        let task = tokio::spawn(async move {
            loop {
                let c = match rx.recv().await {
                    Ok(c) => c,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        st.lock().lagged = true;
                        continue;
                    }
                    Err(_) => return,
                };
                let o: &Value = &c.object;
                if c.res.plural != "pods" || o["metadata"]["labels"]["app"] != label.as_str() {
                    continue;
                }
                let uid = o["metadata"]["uid"].as_str().unwrap_or("").to_string();
                let name = o["metadata"]["name"].as_str().unwrap_or("").to_string();
                let mut g = st.lock();
                let what = if c.kind == EventType::Deleted || !healthy(o) {
                    g.healthy.remove(&uid);
                    if c.kind == EventType::Deleted {
                        format!("{name} removed")
                    } else {
                        format!("{name} not healthy")
                    }
                } else {
                    g.healthy.insert(uid);
                    format!("{name} healthy")
                };
                let n = g.healthy.len();
                if n >= required {
                    g.armed = true;
                }
                if g.armed && g.lowest.as_ref().is_none_or(|(l, _)| n < *l) {
                    g.lowest = Some((n, what));
                }
            }
        });
        BudgetFloor {
            app: app.to_string(),
            required,
            state,
            task,
        }
    }

    /// The fewest healthy pods seen since the budget was first met.
    pub fn lowest(&self) -> Option<usize> {
        self.state.lock().lowest.as_ref().map(|(n, _)| *n)
    }

    /// Fails the test if the app ever had fewer healthy pods than its budget requires
    /// after it first had enough, or if the count could not be followed.
    pub fn assert_held(&self) {
        let g = self.state.lock();
        assert!(
            !g.lagged,
            "the pod change stream lagged: {} not followed",
            self.app
        );
        if let Some((n, what)) = &g.lowest {
            assert!(
                *n >= self.required,
                "budget of {} broken: {n} healthy pods (it requires {}) after {what}",
                self.app,
                self.required
            );
        }
    }
}

impl Drop for BudgetFloor {
    fn drop(&mut self) {
        self.task.abort();
    }
}
