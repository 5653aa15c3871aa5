//! The interruption queue on SQS: long polling, delete after handling.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs as sqs;

use super::convert::classify;
use super::AwsSettings;
use crate::cloud::instrumented::record;
use crate::cloud::queue::{Queue, QueueMessage};
use crate::cloud::{CloudError, CloudResult};

pub struct SqsQueue {
    sqs: sqs::Client,
    url: String,
}

impl SqsQueue {
    pub async fn new(settings: &AwsSettings, url: &str) -> Self {
        Self::from_client(sqs::Client::new(&super::sdk_config(settings).await), url)
    }

    pub fn from_client(client: sqs::Client, url: &str) -> Self {
        Self {
            sqs: client,
            url: url.to_string(),
        }
    }

    /// GetQueueAttributes: whether the queue answers, and how many messages wait.
    pub async fn waiting(&self) -> CloudResult<u64> {
        let r = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await;
        let out = counted("GetQueueAttributes", r)?;
        Ok(out
            .attributes()
            .and_then(|a| a.get(&sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }
}

/// The SDK's answer as a CloudResult, counted like every other AWS call.
fn counted<T, E, R>(
    op: &str,
    r: Result<T, aws_smithy_runtime_api::client::result::SdkError<E, R>>,
) -> CloudResult<T>
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata
        + std::error::Error
        + Send
        + Sync
        + 'static,
    R: std::fmt::Debug + super::HttpStatus,
{
    let r = r.map_err(|e| classify(op, &e));
    record(op, &r);
    r
}

#[async_trait]
impl Queue for SqsQueue {
    async fn receive(&self, max: i32, wait: Duration) -> CloudResult<Vec<QueueMessage>> {
        let r = self
            .sqs
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10))
            .wait_time_seconds(wait.as_secs().min(20) as i32)
            .message_system_attribute_names(
                sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
            )
            .send()
            .await;
        let out = counted("ReceiveMessage", r)?;
        Ok(out
            .messages()
            .iter()
            .map(|m| QueueMessage {
                id: m.message_id().unwrap_or_default().to_string(),
                receipt: m.receipt_handle().unwrap_or_default().to_string(),
                body: m.body().unwrap_or_default().to_string(),
                receive_count: m
                    .attributes()
                    .and_then(|a| {
                        a.get(&sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
                    })
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1),
            })
            .collect())
    }

    async fn delete(&self, message: &QueueMessage) -> CloudResult<()> {
        if message.receipt.is_empty() {
            return Err(CloudError::Rejected {
                operation: "DeleteMessage".into(),
                code: "MissingReceiptHandle".into(),
                message: format!("message {} has no receipt handle", message.id),
            });
        }
        let r = self
            .sqs
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(&message.receipt)
            .send()
            .await;
        counted("DeleteMessage", r)?;
        Ok(())
    }
}
