//! The Remote Execution API over gRPC against a real server (a store on
//! disk, hyper on a loopback socket) with tonic clients generated from
//! the same protos (issue 42 item 3, ADR-071).

mod common;

use common::*;
use futures::{SinkExt, StreamExt};
use store_grpc::proto::build::bazel::remote::execution::v2 as re;
use store_grpc::proto::google::bytestream as bs;
use tonic::Code;

const SHA256: i32 = re::digest_function::Value::Sha256 as i32;
const BLAKE3: i32 = re::digest_function::Value::Blake3 as i32;

fn update(d: re::Digest, data: &[u8]) -> re::batch_update_blobs_request::Request {
    re::batch_update_blobs_request::Request {
        digest: Some(d),
        data: data.to_vec().into(),
        compressor: 0,
    }
}

async fn batch_update(c: &mut Clients, function: i32, blobs: Vec<(re::Digest, &[u8])>) -> Vec<i32> {
    let req = re::BatchUpdateBlobsRequest {
        instance_name: "cc".into(),
        requests: blobs.into_iter().map(|(d, b)| update(d, b)).collect(),
        digest_function: function,
    };
    let r = c.cas.batch_update_blobs(req).await.unwrap().into_inner();
    r.responses
        .iter()
        .map(|r| r.status.as_ref().unwrap().code)
        .collect()
}

async fn find_missing(c: &mut Clients, function: i32, digests: &[re::Digest]) -> Vec<re::Digest> {
    let req = re::FindMissingBlobsRequest {
        instance_name: "cc".into(),
        blob_digests: digests.to_vec(),
        digest_function: function,
    };
    c.cas
        .find_missing_blobs(req)
        .await
        .unwrap()
        .into_inner()
        .missing_blob_digests
}

async fn read(
    c: &mut Clients,
    name: &str,
    offset: i64,
    limit: i64,
) -> Result<Vec<u8>, tonic::Status> {
    let req = bs::ReadRequest {
        resource_name: name.into(),
        read_offset: offset,
        read_limit: limit,
    };
    let mut stream = c.bs.read(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await? {
        assert!(m.data.len() <= store_grpc::READ_CHUNK);
        out.extend_from_slice(&m.data);
    }
    Ok(out)
}

#[tokio::test]
async fn capabilities_offer_sha256_and_blake3_and_updates_to_writers() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let req = re::GetCapabilitiesRequest {
        instance_name: "cc".into(),
    };
    let caps = c
        .caps
        .get_capabilities(req.clone())
        .await
        .unwrap()
        .into_inner();
    let cache = caps.cache_capabilities.unwrap();
    assert!(
        cache.digest_functions.contains(&SHA256),
        "{:?}",
        cache.digest_functions
    );
    assert!(
        cache.digest_functions.contains(&BLAKE3),
        "{:?}",
        cache.digest_functions
    );
    assert!(
        cache
            .action_cache_update_capabilities
            .unwrap()
            .update_enabled
    );
    assert_eq!(
        cache.max_batch_total_size_bytes as u64,
        store_grpc::MAX_BATCH_TOTAL_SIZE
    );
    assert!(caps.execution_capabilities.is_none());
    assert_eq!(caps.high_api_version.unwrap().major, 2);
    // The empty instance name is the only cache namespace.
    let empty = re::GetCapabilitiesRequest {
        instance_name: String::new(),
    };
    assert!(c.caps.get_capabilities(empty).await.is_ok());
    // A reader is told it may not update the action cache.
    let mut r = s.clients(Some(READ_ONLY)).await;
    let caps = r.caps.get_capabilities(req).await.unwrap().into_inner();
    assert!(
        !caps
            .cache_capabilities
            .unwrap()
            .action_cache_update_capabilities
            .unwrap()
            .update_enabled
    );
    // An instance that is no cache namespace.
    let other = re::GetCapabilitiesRequest {
        instance_name: "nope".into(),
    };
    let e = c.caps.get_capabilities(other).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

#[tokio::test]
async fn sha256_blobs_batch_update_find_missing_and_batch_read() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let (a, b) = (b"first blob".to_vec(), bytes(100_000, 7));
    let (da, db) = (digest(&sha256(&a), a.len()), digest(&sha256(&b), b.len()));
    let absent = digest(&sha256(b"never stored"), 12);
    let all = [da.clone(), db.clone(), absent.clone()];
    // No digest_function: 64 hex digits are SHA-256.
    assert_eq!(find_missing(&mut c, 0, &all).await, all.to_vec());
    let codes = batch_update(&mut c, 0, vec![(da.clone(), &a), (db.clone(), &b)]).await;
    assert_eq!(codes, [0, 0]);
    assert_eq!(
        find_missing(&mut c, SHA256, &all).await,
        vec![absent.clone()]
    );
    let req = re::BatchReadBlobsRequest {
        instance_name: "cc".into(),
        digests: all.to_vec(),
        acceptable_compressors: vec![],
        digest_function: SHA256,
    };
    let got = c
        .cas
        .batch_read_blobs(req)
        .await
        .unwrap()
        .into_inner()
        .responses;
    assert_eq!(got[0].data, a);
    assert_eq!(got[1].data, b);
    assert_eq!(got[2].status.as_ref().unwrap().code, Code::NotFound as i32);
    // And over ByteStream, by the SHA-256 name.
    let name = format!("cc/blobs/{}/{}", db.hash, b.len());
    assert_eq!(read(&mut c, &name, 0, 0).await.unwrap(), b);
}

#[tokio::test]
async fn blake3_blobs_batch_update_find_missing_and_batch_read() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let a = bytes(70_000, 3);
    let da = digest(&blake3(&a), a.len());
    let absent = digest(&blake3(b"absent"), 6);
    assert_eq!(
        find_missing(&mut c, BLAKE3, std::slice::from_ref(&da)).await,
        vec![da.clone()]
    );
    assert_eq!(
        batch_update(&mut c, BLAKE3, vec![(da.clone(), &a)]).await,
        [0]
    );
    let both = [da.clone(), absent.clone()];
    assert_eq!(find_missing(&mut c, BLAKE3, &both).await, [absent]);
    let req = re::BatchReadBlobsRequest {
        instance_name: "cc".into(),
        digests: vec![da.clone()],
        acceptable_compressors: vec![],
        digest_function: BLAKE3,
    };
    let got = c
        .cas
        .batch_read_blobs(req)
        .await
        .unwrap()
        .into_inner()
        .responses;
    assert_eq!(got[0].status.as_ref().unwrap().code, 0);
    assert_eq!(got[0].data, a);
    let name = format!("cc/blobs/blake3/{}/{}", da.hash, a.len());
    assert_eq!(read(&mut c, &name, 0, 0).await.unwrap(), a);
}

#[tokio::test]
async fn a_blob_that_does_not_hash_to_its_digest_is_refused() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let body = b"the real bytes".to_vec();
    let wrong = digest(&sha256(b"other bytes!!!"), body.len());
    let codes = batch_update(&mut c, SHA256, vec![(wrong.clone(), &body)]).await;
    assert_eq!(codes, [Code::InvalidArgument as i32]);
    assert_eq!(
        find_missing(&mut c, SHA256, std::slice::from_ref(&wrong)).await,
        [wrong]
    );
    // A BLAKE3 name given SHA-256 bytes' name.
    let b3 = digest(&sha256(&body), body.len());
    let codes = batch_update(&mut c, BLAKE3, vec![(b3, &body)]).await;
    assert_eq!(codes, [Code::InvalidArgument as i32]);
    // A digest that is no 64-hex name at all is refused for the request.
    let req = re::FindMissingBlobsRequest {
        instance_name: "cc".into(),
        blob_digests: vec![digest("abc", 3)],
        digest_function: 0,
    };
    let e = c.cas.find_missing_blobs(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
}

fn write_msg(name: &str, offset: usize, data: &[u8], finish: bool) -> bs::WriteRequest {
    bs::WriteRequest {
        resource_name: name.into(),
        write_offset: offset as i64,
        finish_write: finish,
        data: data.to_vec().into(),
    }
}

async fn query(c: &mut Clients, name: &str) -> Result<bs::QueryWriteStatusResponse, tonic::Status> {
    let req = bs::QueryWriteStatusRequest {
        resource_name: name.into(),
    };
    c.bs.query_write_status(req).await.map(|r| r.into_inner())
}

/// A `Write` of `msgs` as a client resumes one: while the server still
/// holds the upload for a call the client abandoned (it has not seen that
/// call's stream end yet) the answer is `ABORTED` (`upload_busy`), which
/// REAPI clients retry; so does this, for up to 10 s.
async fn write_resuming(
    c: &mut Clients,
    msgs: Vec<bs::WriteRequest>,
) -> Result<bs::WriteResponse, tonic::Status> {
    let started = std::time::Instant::now();
    loop {
        match c.bs.write(futures::stream::iter(msgs.clone())).await {
            Err(e) if e.code() == Code::Aborted && started.elapsed().as_secs() < 10 => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            r => return r.map(|r| r.into_inner()),
        }
    }
}

#[tokio::test]
async fn a_bytestream_write_in_chunks_is_interrupted_then_resumed() {
    const MIB: usize = 1 << 20;
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let blob = bytes(6 * MIB + 123, 9);
    let hash = sha256(&blob);
    let name = format!(
        "cc/uploads/4b6e3c1a-0000-4000-8000-000000000001/blobs/{hash}/{}",
        blob.len()
    );
    assert_eq!(
        query(&mut c, &name).await.unwrap_err().code(),
        Code::NotFound
    );
    // Three whole MiB, then the client stops sending and goes away.
    let (mut tx, rx) = futures::channel::mpsc::channel::<bs::WriteRequest>(4);
    let mut writer = c.bs.clone();
    let call = tokio::spawn(async move { writer.write(rx).await });
    for i in 0..3 {
        let chunk = &blob[i * MIB..(i + 1) * MIB];
        tx.send(write_msg(&name, i * MIB, chunk, false))
            .await
            .unwrap();
    }
    // Each whole segment is committed as it arrives.
    // (Until the server has the first message, no write is in progress.)
    let committed = loop {
        match query(&mut c, &name).await {
            Ok(st) if st.committed_size as usize == 3 * MIB => break st,
            Ok(st) => assert!((st.committed_size as usize) < 3 * MIB),
            Err(e) => assert_eq!(e.code(), Code::NotFound, "{e:?}"),
        }
        tokio::task::yield_now().await;
    };
    assert!(!committed.complete);
    call.abort();
    let _ = call.await;
    drop(tx);
    let st = query(&mut c, &name).await.unwrap();
    assert_eq!(st.committed_size as usize, 3 * MIB);
    // A resume at the wrong offset is refused, naming where it stands.
    let wrong = vec![write_msg(&name, MIB, &blob[MIB..2 * MIB], false)];
    let e = write_resuming(&mut c, wrong).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // A client may also start over at 0 (the committed bytes go); here
    // it sends one MiB and stops, and then resumes at that MiB.
    let (mut tx, rx) = futures::channel::mpsc::channel::<bs::WriteRequest>(4);
    let mut writer = c.bs.clone();
    let call = tokio::spawn(async move { writer.write(rx).await });
    tx.send(write_msg(&name, 0, &blob[..MIB], false))
        .await
        .unwrap();
    loop {
        match query(&mut c, &name).await {
            Ok(st) if st.committed_size as usize == MIB => break,
            Ok(_) => {}
            // (Between the old session's end and the new one's start.)
            Err(e) => assert_eq!(e.code(), Code::NotFound, "{e:?}"),
        }
        tokio::task::yield_now().await;
    }
    call.abort();
    let _ = call.await;
    let msgs = vec![
        write_msg(&name, MIB, &blob[MIB..2 * MIB], false),
        write_msg("", 2 * MIB, &blob[2 * MIB..3 * MIB], false),
    ];
    let e = write_resuming(&mut c, msgs).await.unwrap_err();
    // (It ended without finish_write: the bytes are committed.)
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        query(&mut c, &name).await.unwrap().committed_size as usize,
        3 * MIB
    );
    // Resumed at the committed size, in 700 KiB chunks, finished.
    let mut msgs = Vec::new();
    let mut at = 3 * MIB;
    while at < blob.len() {
        let end = (at + 700 * 1024).min(blob.len());
        msgs.push(write_msg(
            if at == 3 * MIB { &name } else { "" },
            at,
            &blob[at..end],
            end == blob.len(),
        ));
        at = end;
    }
    let r = write_resuming(&mut c, msgs).await.unwrap();
    assert_eq!(r.committed_size as usize, blob.len());
    let st = query(&mut c, &name).await.unwrap();
    assert!(st.complete);
    assert_eq!(st.committed_size as usize, blob.len());
    let read_name = format!("cc/blobs/{hash}/{}", blob.len());
    assert!(read(&mut c, &read_name, 0, 0).await.unwrap() == blob);
    // Writing it again is answered at once: it is stored.
    let again = format!(
        "cc/uploads/4b6e3c1a-0000-4000-8000-000000000002/blobs/{hash}/{}",
        blob.len()
    );
    let one = futures::stream::iter(vec![write_msg(&again, 0, &blob[..MIB], false)]);
    let r = c.bs.write(one).await.unwrap().into_inner();
    assert_eq!(r.committed_size as usize, blob.len());
}

#[tokio::test]
async fn a_bytestream_write_whose_bytes_do_not_match_is_refused() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let blob = bytes(300_000, 1);
    let name = format!(
        "cc/uploads/u1/blobs/blake3/{}/{}",
        blake3(b"something else"),
        blob.len()
    );
    let e =
        c.bs.write(futures::stream::iter(vec![write_msg(
            &name, 0, &blob, true,
        )]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("verification"), "{e:?}");
    // The session is gone: a new write starts at 0.
    assert_eq!(
        query(&mut c, &name).await.unwrap_err().code(),
        Code::NotFound
    );
}

#[tokio::test]
async fn a_bytestream_read_honours_offset_and_limit() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let blob = bytes(3 * (1 << 20) + 17, 5);
    let hash = blake3(&blob);
    let up = format!("cc/uploads/r/blobs/blake3/{hash}/{}", blob.len());
    let msgs: Vec<_> = blob
        .chunks(1 << 20)
        .enumerate()
        .map(|(i, ch)| write_msg(&up, i << 20, ch, (i + 1) << 20 >= blob.len()))
        .collect();
    c.bs.write(futures::stream::iter(msgs)).await.unwrap();
    let name = format!("cc/blobs/blake3/{hash}/{}", blob.len());
    assert!(read(&mut c, &name, 0, 0).await.unwrap() == blob);
    assert_eq!(
        read(&mut c, &name, 1000, 5000).await.unwrap(),
        &blob[1000..6000]
    );
    let tail = read(&mut c, &name, 2 << 20, 0).await.unwrap();
    assert!(tail == blob[2 << 20..]);
    assert!(read(&mut c, &name, blob.len() as i64, 0)
        .await
        .unwrap()
        .is_empty());
    let e = read(&mut c, &name, blob.len() as i64 + 1, 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let e = read(&mut c, &name, -1, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let absent = format!("cc/blobs/{}/5", sha256(b"nope!"));
    assert_eq!(
        read(&mut c, &absent, 0, 0).await.unwrap_err().code(),
        Code::NotFound
    );
}

fn action_result(outputs: &[(&str, re::Digest)]) -> re::ActionResult {
    re::ActionResult {
        output_files: outputs
            .iter()
            .map(|(p, d)| re::OutputFile {
                path: p.to_string(),
                digest: Some(d.clone()),
                is_executable: false,
                ..Default::default()
            })
            .collect(),
        exit_code: 0,
        ..Default::default()
    }
}

async fn get_ac(c: &mut Clients, action: &re::Digest) -> Result<re::ActionResult, tonic::Status> {
    let req = re::GetActionResultRequest {
        instance_name: "cc".into(),
        action_digest: Some(action.clone()),
        digest_function: SHA256,
        ..Default::default()
    };
    c.ac.get_action_result(req).await.map(|r| r.into_inner())
}

async fn update_ac(
    c: &mut Clients,
    action: &re::Digest,
    ar: &re::ActionResult,
) -> Result<re::ActionResult, tonic::Status> {
    let req = re::UpdateActionResultRequest {
        instance_name: "cc".into(),
        action_digest: Some(action.clone()),
        action_result: Some(ar.clone()),
        digest_function: SHA256,
        ..Default::default()
    };
    c.ac.update_action_result(req).await.map(|r| r.into_inner())
}

#[tokio::test]
async fn an_action_result_is_served_while_its_outputs_are_present() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let out = b"compiled output".to_vec();
    let dout = digest(&sha256(&out), out.len());
    assert_eq!(
        batch_update(&mut c, SHA256, vec![(dout.clone(), &out)]).await,
        [0]
    );
    let action = digest(&sha256(b"an action"), 9);
    assert_eq!(
        get_ac(&mut c, &action).await.unwrap_err().code(),
        Code::NotFound
    );
    let ar = action_result(&[("out/a.o", dout)]);
    assert_eq!(update_ac(&mut c, &action, &ar).await.unwrap(), ar);
    assert_eq!(get_ac(&mut c, &action).await.unwrap(), ar);
}

#[tokio::test]
async fn an_action_result_with_a_missing_output_is_not_found() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let out = b"present output".to_vec();
    let dout = digest(&sha256(&out), out.len());
    assert_eq!(
        batch_update(&mut c, SHA256, vec![(dout.clone(), &out)]).await,
        [0]
    );
    let gone = digest(&sha256(b"never uploaded"), 14);
    let action = digest(&sha256(b"another action"), 14);
    let ar = action_result(&[("out/a", dout), ("out/b", gone)]);
    update_ac(&mut c, &action, &ar).await.unwrap();
    let e = get_ac(&mut c, &action).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

#[tokio::test]
async fn get_tree_walks_the_directories_present() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    use prost::Message;
    let leaf = re::Directory {
        files: vec![re::FileNode {
            name: "f".into(),
            digest: Some(digest(&sha256(b"x"), 1)),
            ..Default::default()
        }],
        ..Default::default()
    };
    let leaf_bytes = leaf.encode_to_vec();
    let dleaf = digest(&sha256(&leaf_bytes), leaf_bytes.len());
    let root = re::Directory {
        directories: vec![re::DirectoryNode {
            name: "sub".into(),
            digest: Some(dleaf.clone()),
        }],
        ..Default::default()
    };
    let root_bytes = root.encode_to_vec();
    let droot = digest(&sha256(&root_bytes), root_bytes.len());
    let blobs = vec![(droot.clone(), &root_bytes[..]), (dleaf, &leaf_bytes[..])];
    assert_eq!(batch_update(&mut c, SHA256, blobs).await, [0, 0]);
    let req = re::GetTreeRequest {
        instance_name: "cc".into(),
        root_digest: Some(droot),
        page_size: 1,
        page_token: String::new(),
        digest_function: SHA256,
    };
    let mut stream = c.cas.get_tree(req).await.unwrap().into_inner();
    let mut dirs = Vec::new();
    while let Some(page) = stream.next().await {
        let page = page.unwrap();
        assert!(page.directories.len() <= 1);
        dirs.extend(page.directories);
    }
    assert_eq!(dirs, [root, leaf]);
}

#[tokio::test]
async fn no_key_is_unauthenticated_and_a_wrong_key_too() {
    let s = start().await;
    let mut c = s.clients(None).await;
    let e = find_missing_err(&mut c).await;
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let action = digest(&sha256(b"act"), 3);
    let e = get_ac(&mut c, &action).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let name = format!("cc/blobs/{}/1", sha256(b"a"));
    let e = read(&mut c, &name, 0, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    // Capabilities are protocol parameters, answered without credentials
    // (Bazel 2.1 sends none with this call); writes are authorized each.
    let req = re::GetCapabilitiesRequest {
        instance_name: "cc".into(),
    };
    let caps = c
        .caps
        .get_capabilities(req.clone())
        .await
        .unwrap()
        .into_inner();
    let update = caps
        .cache_capabilities
        .unwrap()
        .action_cache_update_capabilities;
    assert!(update.unwrap().update_enabled);
    // A key that matches none is refused everywhere.
    let mut w = s.clients(Some("bpk_wrong")).await;
    let e = w.caps.get_capabilities(req).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = find_missing_err(&mut w).await;
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

async fn find_missing_err(c: &mut Clients) -> tonic::Status {
    let req = re::FindMissingBlobsRequest {
        instance_name: "cc".into(),
        blob_digests: vec![digest(&sha256(b"a"), 1)],
        digest_function: SHA256,
    };
    c.cas.find_missing_blobs(req).await.unwrap_err()
}

#[tokio::test]
async fn a_read_only_key_reads_but_cannot_write() {
    let s = start().await;
    let mut r = s.clients(Some(READ_ONLY)).await;
    let body = b"read only".to_vec();
    let d = digest(&sha256(&body), body.len());
    let req = re::BatchUpdateBlobsRequest {
        instance_name: "cc".into(),
        requests: vec![update(d.clone(), &body)],
        digest_function: SHA256,
    };
    let e = r.cas.batch_update_blobs(req).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let action = digest(&sha256(b"act"), 3);
    let e = update_ac(&mut r, &action, &action_result(&[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let name = format!("cc/uploads/u/blobs/{}/{}", d.hash, body.len());
    let one = futures::stream::iter(vec![write_msg(&name, 0, &body, true)]);
    let e = r.bs.write(one).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // Reads are allowed, and nothing was stored.
    assert_eq!(
        find_missing(&mut r, SHA256, std::slice::from_ref(&d)).await,
        [d]
    );
}

#[tokio::test]
async fn http_requests_on_the_same_port_still_reach_the_http_router() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start().await;
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = String::new();
    tcp.read_to_string(&mut got).await.unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("ok"), "{got}");
}

#[tokio::test]
async fn hits_and_misses_are_counted_per_method_and_calls_are_timed() {
    let s = start().await;
    let mut c = s.clients(Some(FULL)).await;
    let out = b"metered".to_vec();
    let dout = digest(&sha256(&out), out.len());
    let absent = digest(&sha256(b"absent!"), 7);
    assert_eq!(
        batch_update(&mut c, SHA256, vec![(dout.clone(), &out)]).await,
        [0]
    );
    find_missing(&mut c, SHA256, &[dout.clone(), absent.clone()]).await;
    let action = digest(&sha256(b"metered action"), 14);
    assert!(get_ac(&mut c, &action).await.is_err());
    update_ac(&mut c, &action, &action_result(&[("o", dout.clone())]))
        .await
        .unwrap();
    get_ac(&mut c, &action).await.unwrap();
    let name = format!("cc/blobs/{}/{}", absent.hash, absent.size_bytes);
    assert!(read(&mut c, &name, 0, 0).await.is_err());
    let text = s.ops.render_metrics();
    let family = "blobpool_grpc_cache_requests_total";
    let cas = "/build.bazel.remote.execution.v2.ContentAddressableStorage";
    let ac = "/build.bazel.remote.execution.v2.ActionCache/GetActionResult";
    for line in [
        format!("{family}{{method=\"{cas}/FindMissingBlobs\",result=\"hit\"}} 1"),
        format!("{family}{{method=\"{cas}/FindMissingBlobs\",result=\"miss\"}} 1"),
        format!("{family}{{method=\"{ac}\",result=\"hit\"}} 1"),
        format!("{family}{{method=\"{ac}\",result=\"miss\"}} 1"),
        format!("{family}{{method=\"/google.bytestream.ByteStream/Read\",result=\"miss\"}} 1"),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let timed = s.ops.metrics().requests_timed(ac, "POST");
    assert_eq!(timed, 2);
}
