//! Range positions past `u64::MAX` (issue 39, RFC 9110 §14.1.1): a last
//! position that large is clamped to the end (`206` with the satisfiable
//! part), a first position that large is past the end (`416`), a suffix
//! that long is the whole entry. They used to fail to parse, so the header
//! was ignored and the whole entry answered `200`.

mod common;

use common::*;

const HUGE: &str = "1000000000000000000000000000000";

#[tokio::test]
async fn positions_past_u64_max_are_clamped_or_unsatisfiable() {
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    // Both tiers: inline (small) and large-tier entries.
    for (ns, len) in [("small", 100u64), ("big", 10_000u64)] {
        let data = bytes_of(len, 9);
        let (_t, d) = s.put_ok(ns, data.clone()).await;
        let path = format!("/v1/blobs/{ns}/{d}");
        let ranged = |range: String| {
            let req = s.http.get(s.url(&path)).header("range", range);
            async move { req.send().await.unwrap() }
        };
        for (range, want) in [
            (format!("bytes=0-{HUGE}"), 0..len),
            (format!("bytes=7-{HUGE}"), 7..len),
            ("bytes=3-18446744073709551616".to_string(), 3..len),
            (format!("bytes=-{HUGE}"), 0..len),
        ] {
            let resp = ranged(range.clone()).await;
            assert_eq!(resp.status(), 206, "{ns} {range}");
            assert_eq!(
                resp.headers()["content-range"].to_str().unwrap(),
                format!("bytes {}-{}/{len}", want.start, want.end - 1),
                "{ns} {range}"
            );
            let body = resp.bytes().await.unwrap();
            assert_eq!(
                &body[..],
                &data[want.start as usize..want.end as usize],
                "{ns} {range}"
            );
        }
        // A first position past u64::MAX is past the end, like any first
        // position at or past the size.
        for range in [format!("bytes={HUGE}-"), format!("bytes={HUGE}-{HUGE}")] {
            let resp = ranged(range.clone()).await;
            assert_eq!(
                resp.headers()["content-range"].to_str().unwrap(),
                format!("bytes */{len}"),
                "{ns} {range}"
            );
            assert_error(resp, 416, "invalid_range").await;
        }
        // Last before first is still invalid syntax, however long the
        // numbers: the header is ignored.
        let resp = ranged(format!("bytes={HUGE}1-{HUGE}")).await;
        assert_eq!(resp.status(), 200, "{ns}");
        assert_eq!(resp.bytes().await.unwrap().len() as u64, len);
    }
}
