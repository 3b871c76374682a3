//! `changes_since_bounded`, the page read of the server's live streams: a page stops once its
//! changes hold about `max_bytes` of attrs and payloads, and reading page after page returns
//! exactly what one unbounded read returns, in order, with nothing skipped.
//!
//! Why it exists: every span change carries its span's attrs, and a stream holds its page until
//! its client has taken it. 500 changes of a span with a megabyte of attrs were half a gigabyte
//! per client that read nothing (an audit's finding: five such clients took the server to
//! 1.6 GB).

mod support;

use flightlog_core::activity::{ActivityStore, JsonObject, SpanKind, SpanPatch};
use serde_json::json;

const BIG_ATTRS_BYTES: usize = 300_000;

#[tokio::test]
async fn pages_are_bounded_in_bytes_and_skip_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = support::open_store(&dir.path().join("p.db"), "w");
    let mut attrs = JsonObject::new();
    attrs.insert("blob".into(), json!("x".repeat(BIG_ATTRS_BYTES)));
    let mut big = support::span_input("big", "run", None, SpanKind::Turn);
    big.attrs = Some(attrs);
    store.start_span(big).await.expect("start");
    // 40 patches (each a change carrying the big attrs) with a small event between them.
    for round in 0..40_i64 {
        let mut patch_attrs = JsonObject::new();
        patch_attrs.insert("round".into(), json!(round));
        let patched = store
            .patch_span(
                "big",
                SpanPatch {
                    attrs: Some(patch_attrs),
                    usage: None,
                    wait_until: None,
                },
            )
            .await
            .expect("patch");
        assert!(patched);
        store
            .append_event(
                "big",
                "tick",
                Some(&json!({"round": round})),
                Some(2_000 + round),
            )
            .await
            .expect("event")
            .expect("the span exists");
    }
    let all = store.changes_since(0, 10_000).await.expect("all changes");
    assert_eq!(all.len(), 81, "a start, 40 patches and 40 events");

    // Bounded to 1 MiB: at most four big changes and what fits beside them, then the one that
    // passed the bound.
    let max_bytes = 1024 * 1024;
    let mut cursor = 0;
    let mut paged = Vec::new();
    let mut pages = 0;
    loop {
        let page = store
            .changes_since_bounded(cursor, 500, max_bytes)
            .await
            .expect("a page");
        let Some(last) = page.last() else { break };
        cursor = last.change_id;
        let big = page
            .iter()
            .filter(|change| {
                matches!(
                    change.body,
                    flightlog_core::activity::ChangeBody::Span { .. }
                )
            })
            .count();
        assert!(
            big <= max_bytes / BIG_ATTRS_BYTES + 1,
            "a page of {} changes held {big} big ones",
            page.len()
        );
        pages += 1;
        paged.extend(page);
    }
    assert!(pages >= 81 / 8, "{pages} pages");
    let ids = |changes: &[flightlog_core::activity::ActivityChange]| {
        changes.iter().map(|c| c.change_id).collect::<Vec<_>>()
    };
    assert_eq!(ids(&paged), ids(&all), "page after page is one read");
    assert_eq!(paged, all);

    // A change larger than the bound still comes, alone: a page is never empty while changes
    // remain.
    let first = store
        .changes_since_bounded(0, 500, 10)
        .await
        .expect("a page");
    assert_eq!(ids(&first), vec![all[0].change_id]);
    // The count still bounds it, and zero gives none.
    let counted = store
        .changes_since_bounded(0, 3, usize::MAX)
        .await
        .expect("a page");
    assert_eq!(ids(&counted), ids(&all[..3]));
    assert!(store
        .changes_since_bounded(0, 0, usize::MAX)
        .await
        .expect("a page")
        .is_empty());
}
