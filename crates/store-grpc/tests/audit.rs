//! Audit lines of the gRPC binding (one test per file: it installs the
//! process's subscriber): refused writes and replaced action results
//! write `blobpool::audit` lines as the HTTP binding does, marked
//! `protocol = "grpc"`.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use store_grpc::proto::build::bazel::remote::execution::v2 as re;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn update_ac(action: &re::Digest, exit_code: i32) -> re::UpdateActionResultRequest {
    re::UpdateActionResultRequest {
        instance_name: "cc".into(),
        action_digest: Some(action.clone()),
        action_result: Some(re::ActionResult {
            exit_code,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn refused_writes_and_replaced_results_are_audited() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("blobpool::audit=info")
        .with_writer(move || writer.clone())
        .init();
    let s = start().await;
    let mut r = s.clients(Some(READ_ONLY)).await;
    let body = b"audited".to_vec();
    let d = digest(&sha256(&body), body.len());
    let req = re::BatchUpdateBlobsRequest {
        instance_name: "cc".into(),
        requests: vec![re::batch_update_blobs_request::Request {
            digest: Some(d),
            data: body.into(),
            compressor: 0,
        }],
        digest_function: 0,
    };
    assert!(r.cas.batch_update_blobs(req).await.is_err());
    let action = digest(&sha256(b"audited action"), 14);
    assert!(r
        .ac
        .update_action_result(update_ac(&action, 0))
        .await
        .is_err());
    // A writer's first result is not audited; replacing it is.
    let mut w = s.clients(Some(FULL)).await;
    w.ac.update_action_result(update_ac(&action, 0))
        .await
        .unwrap();
    w.ac.update_action_result(update_ac(&action, 1))
        .await
        .unwrap();
    let lines = log.lines();
    let fields: Vec<&serde_json::Value> = lines.iter().map(|l| &l["fields"]).collect();
    assert_eq!(fields.len(), 3, "{lines:?}");
    let f = fields[0];
    assert_eq!(f["action"], "grpc_batch_update_blobs");
    assert_eq!(
        (f["identity"].as_str(), f["outcome"].as_str()),
        (Some("reader"), Some("forbidden"))
    );
    assert_eq!(f["protocol"], "grpc");
    assert_eq!(fields[1]["action"], "grpc_update_action_result");
    assert_eq!(fields[1]["outcome"], "forbidden");
    assert_eq!(fields[1]["target"], format!("cc/ac/{}", action.hash));
    let replaced = fields[2]["outcome"].as_str().unwrap();
    assert!(
        replaced.starts_with("ok: ") && replaced.contains(" -> "),
        "{replaced}"
    );
    assert_eq!(fields[2]["identity"], "full");
}
