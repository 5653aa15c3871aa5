//! The interruption queue: messages in, deleted once handled. SQS in production
//! ([`super::aws::sqs::SqsQueue`]), a memory queue for the demo and unit tests.

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::CloudResult;

/// One received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMessage {
    pub id: String,
    /// What deletes it (SQS's receipt handle).
    pub receipt: String,
    pub body: String,
    /// How often it was received, this time included (SQS's ApproximateReceiveCount).
    pub receive_count: u32,
}

#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Up to `max` messages, waiting up to `wait` for the first (long polling).
    async fn receive(&self, max: i32, wait: Duration) -> CloudResult<Vec<QueueMessage>>;
    /// Deletes a handled message.
    async fn delete(&self, message: &QueueMessage) -> CloudResult<()>;
}

/// A queue in memory: what is sent is received in order; a received message is
/// invisible until deleted or [`MemoryQueue::redeliver`] puts it back.
#[derive(Default)]
pub struct MemoryQueue {
    state: Mutex<MemoryQueueState>,
    arrived: tokio::sync::Notify,
}

#[derive(Default)]
struct MemoryQueueState {
    next: u64,
    ready: VecDeque<QueueMessage>,
    in_flight: Vec<QueueMessage>,
    deleted: Vec<String>,
    /// How many more receives are refused ([`MemoryQueue::refuse_receives`]).
    refused: u32,
}

impl MemoryQueue {
    pub fn send(&self, body: &str) -> String {
        let mut st = self.state.lock();
        st.next += 1;
        let id = format!("m-{}", st.next);
        st.ready.push_back(QueueMessage {
            id: id.clone(),
            receipt: String::new(),
            body: body.to_string(),
            receive_count: 0,
        });
        drop(st);
        self.arrived.notify_waiters();
        id
    }

    /// Received but not deleted messages become visible again (a visibility timeout).
    pub fn redeliver(&self) {
        let mut st = self.state.lock();
        let back: Vec<_> = st.in_flight.drain(..).collect();
        st.ready.extend(back);
        drop(st);
        self.arrived.notify_waiters();
    }

    /// The next `times` receives are refused as SQS throttles (`OverLimit`, or the
    /// account's API rate), before anything is taken: no message becomes invisible.
    pub fn refuse_receives(&self, times: u32) {
        self.state.lock().refused = times;
    }

    /// How many more receives [`Self::refuse_receives`] still refuses.
    pub fn receives_refused_left(&self) -> u32 {
        self.state.lock().refused
    }

    /// Ids of deleted messages, in order.
    pub fn deleted(&self) -> Vec<String> {
        self.state.lock().deleted.clone()
    }

    /// Messages not deleted yet (visible or in flight).
    pub fn pending(&self) -> usize {
        let st = self.state.lock();
        st.ready.len() + st.in_flight.len()
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn receive(&self, max: i32, wait: Duration) -> CloudResult<Vec<QueueMessage>> {
        let take = |st: &mut MemoryQueueState| {
            let n = (max.max(1) as usize).min(st.ready.len());
            let mut out = Vec::with_capacity(n);
            for mut m in st.ready.drain(..n).collect::<Vec<_>>() {
                m.receive_count += 1;
                m.receipt = format!("{}#{}", m.id, m.receive_count);
                st.in_flight.push(m.clone());
                out.push(m);
            }
            out
        };
        let notified = self.arrived.notified();
        {
            let mut st = self.state.lock();
            if st.refused > 0 {
                st.refused -= 1;
                return Err(super::CloudError::Throttled {
                    operation: "ReceiveMessage".into(),
                    message: "OverLimit: too many requests (memory queue)".into(),
                });
            }
        }
        let got = take(&mut self.state.lock());
        if !got.is_empty() {
            return Ok(got);
        }
        let _ = tokio::time::timeout(wait, notified).await;
        Ok(take(&mut self.state.lock()))
    }

    async fn delete(&self, message: &QueueMessage) -> CloudResult<()> {
        let mut st = self.state.lock();
        if let Some(i) = st
            .in_flight
            .iter()
            .position(|m| m.receipt == message.receipt)
        {
            let m = st.in_flight.remove(i);
            st.deleted.push(m.id);
        }
        Ok(())
    }
}
