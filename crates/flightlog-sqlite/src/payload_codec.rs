//! Event payload and span attrs compression: zstd with a dictionary trained on this database's
//! own payloads and attrs.
//!
//! Event payloads are the bulk of an activity database (a tool call's input and output, a few
//! hundred bytes of JSON each), and they are highly repetitive across events: the same keys, the
//! same tools, the same paths. A zstd dictionary trained on the first payloads a database sees
//! captures that repetition, which per-value compression of 300-byte texts cannot.
//!
//! Storage: a payload is kept as plain JSON `TEXT` (with `dict_id` NULL) until a dictionary
//! exists, and whenever compression would not make it smaller; otherwise as a zstd frame `BLOB`
//! with the id of the dictionary row (`payload_dictionaries`) it needs. Dictionary rows are never
//! changed or deleted, so any process can cache them by id forever. Span attrs (most of an
//! OTLP span's bytes) are packed the same way since schema v8: the `attrs` column holds either
//! the JSON text or a `BLOB` of the dictionary id and the frame ([`PayloadCodec::pack_attrs`]).
//!
//! Compression runs on the caller's thread (not the writer's), decompression on the reader's,
//! each with a thread-local zstd context per dictionary.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use flightlog_core::activity::StoreError;
use rusqlite::{Connection, OptionalExtension};

use crate::error::backend;

/// Payloads shorter than this are stored as they are: the frame overhead would eat the gain.
const MIN_COMPRESSIBLE_BYTES: usize = 64;
/// Sample volume collected before a dictionary is trained.
const TRAINING_SAMPLE_BYTES: usize = 256 * 1024;
/// Largest dictionary trained.
const MAX_DICTIONARY_BYTES: usize = 16 * 1024;
/// Upper bound of a decompressed payload (the cap keeps them far smaller).
const MAX_PAYLOAD_BYTES: usize = 1 << 20;
const COMPRESSION_LEVEL: i32 = 3;

/// A trained dictionary and its row id.
#[derive(Debug)]
pub(crate) struct Dictionary {
    pub id: i64,
    pub bytes: Vec<u8>,
}

/// A payload compressed for the `payload` and `dict_id` columns.
#[derive(Debug, Clone)]
pub(crate) struct CompressedPayload {
    pub dict_id: i64,
    pub frame: Vec<u8>,
}

#[derive(Debug, Default)]
struct Samples {
    payloads: Vec<Vec<u8>>,
    bytes: usize,
}

/// The dictionaries of one database, and the sample collection that trains the first one.
#[derive(Debug, Default)]
pub(crate) struct PayloadCodec {
    current: RwLock<Option<Arc<Dictionary>>>,
    known: RwLock<HashMap<i64, Arc<Dictionary>>>,
    samples: Mutex<Samples>,
    training: AtomicBool,
}

// Each thread keeps the context of the dictionary it used last, with that dictionary itself:
// a context is told from another by the dictionary's allocation, not by its row id, since every
// database's first dictionary has id 1 and a process may have several databases open (keyed by
// id, a payload of one database was compressed with another's dictionary and never read again).
// Holding the `Arc` keeps the allocation from being reused for another dictionary.
thread_local! {
    static COMPRESSOR: RefCell<Option<(Arc<Dictionary>, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<(Arc<Dictionary>, zstd::bulk::Decompressor<'static>)>> =
        const { RefCell::new(None) };
}

impl PayloadCodec {
    /// Load the newest dictionary of the database, if it has one. A database whose newest
    /// dictionary was trained before attrs were packed (schema version 8 notes which) keeps
    /// using it and collects samples for one more, trained on attrs as well.
    pub fn load(conn: &Connection) -> Result<Self, StoreError> {
        let codec = Self::default();
        let newest: Option<(i64, Vec<u8>)> = conn
            .query_row(
                "SELECT dict_id, dictionary FROM payload_dictionaries \
                 ORDER BY dict_id DESC LIMIT 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(backend)?;
        let trained_before_attrs: i64 = conn
            .query_row(
                "SELECT COALESCE((SELECT value FROM flightlog_meta \
                 WHERE name = 'dictionaries_before_attrs'), 0)",
                [],
                |row| row.get(0),
            )
            .map_err(backend)?;
        if let Some((id, bytes)) = newest {
            codec.install(Arc::new(Dictionary { id, bytes }));
            // One dictionary per database is enough; do not train another.
            codec
                .training
                .store(id > trained_before_attrs, Ordering::Release);
        }
        Ok(codec)
    }

    /// Make `dictionary` the one new payloads are compressed with.
    pub fn install(&self, dictionary: Arc<Dictionary>) {
        if let Ok(mut known) = self.known.write() {
            known.insert(dictionary.id, dictionary.clone());
        }
        if let Ok(mut current) = self.current.write() {
            *current = Some(dictionary);
        }
    }

    /// Compress a capped payload's JSON for storage; `None` means store the text as it is.
    /// Until the dictionary is trained (see [`Self::load`]) the text is also kept as a training
    /// sample.
    pub fn encode(&self, json: &str) -> Option<CompressedPayload> {
        if json.len() < MIN_COMPRESSIBLE_BYTES {
            return None;
        }
        // Until a dictionary (or the one that replaces a payloads-only one) is being trained,
        // the text is also a training sample; the common case costs one atomic load.
        if !self.training.load(Ordering::Acquire) {
            self.collect_sample(json);
        }
        let current = self.current.read().ok().and_then(|slot| slot.clone());
        let dictionary = current?;
        let frame = COMPRESSOR.with(|slot| {
            let mut slot = slot.borrow_mut();
            if !slot
                .as_ref()
                .is_some_and(|(cached, _)| Arc::ptr_eq(cached, &dictionary))
            {
                *slot =
                    zstd::bulk::Compressor::with_dictionary(COMPRESSION_LEVEL, &dictionary.bytes)
                        .ok()
                        .map(|compressor| (Arc::clone(&dictionary), compressor));
            }
            slot.as_mut()
                .and_then(|(_, compressor)| compressor.compress(json.as_bytes()).ok())
        });
        match frame {
            Some(frame) if frame.len() < json.len() => Some(CompressedPayload {
                dict_id: dictionary.id,
                frame,
            }),
            _ => None,
        }
    }

    /// Pack a span's attrs JSON for the `attrs` column: the dictionary's id (4 bytes, little
    /// endian), then the zstd frame. `None` means store the text as it is: short, too long to
    /// unpack within [`MAX_PAYLOAD_BYTES`], no dictionary yet (the text is kept as a training
    /// sample then, as a payload's is), or not made smaller.
    ///
    /// Attrs are most of an OTLP span's bytes (its own attributes plus the resource's and the
    /// scope's, the same in every span of a service), and they repeat across spans as payloads
    /// do: a dictionary trained on both packs such attrs to a tenth.
    pub fn pack_attrs(&self, json: &str) -> Option<Vec<u8>> {
        if json.len() > MAX_PAYLOAD_BYTES {
            return None;
        }
        let compressed = self.encode(json)?;
        let id = u32::try_from(compressed.dict_id).ok()?;
        let mut packed = Vec::with_capacity(4 + compressed.frame.len());
        packed.extend_from_slice(&id.to_le_bytes());
        packed.extend_from_slice(&compressed.frame);
        (packed.len() < json.len()).then_some(packed)
    }

    /// The JSON text of attrs packed by [`Self::pack_attrs`].
    pub fn unpack_attrs(&self, conn: &Connection, packed: &[u8]) -> Result<String, StoreError> {
        let Some((id, frame)) = packed.split_first_chunk::<4>() else {
            return Err(StoreError::Corrupt(
                "packed attrs are shorter than their header".into(),
            ));
        };
        self.decode(
            conn,
            Some(i64::from(u32::from_le_bytes(*id))),
            rusqlite::types::ValueRef::Blob(frame),
        )
    }

    /// The length of the text in a zstd frame of [`Self::encode`] (or of packed attrs after
    /// their 4-byte dictionary id), read from the frame's header without decompressing it.
    /// `None` when the header does not say or is damaged.
    pub fn frame_text_len(frame: &[u8]) -> Option<u64> {
        zstd::zstd_safe::get_frame_content_size(frame)
            .ok()
            .flatten()
    }

    fn collect_sample(&self, json: &str) {
        if let Ok(mut samples) = self.samples.lock() {
            if samples.bytes < TRAINING_SAMPLE_BYTES {
                samples.bytes += json.len();
                samples.payloads.push(json.as_bytes().to_vec());
            }
        }
    }

    /// When enough samples are in and nobody is training yet, hand them out (once).
    pub fn take_training_samples(&self) -> Option<Vec<Vec<u8>>> {
        // The common case (a dictionary exists or is being trained) costs one atomic load.
        if self.training.load(Ordering::Acquire) {
            return None;
        }
        let ready = self
            .samples
            .lock()
            .map(|samples| samples.bytes >= TRAINING_SAMPLE_BYTES)
            .unwrap_or(false);
        if !ready || self.training.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.samples
            .lock()
            .ok()
            .map(|mut samples| std::mem::take(&mut samples.payloads))
    }

    /// Train a dictionary from samples (CPU work: call it off the writer and async threads).
    pub fn train(samples: &[Vec<u8>]) -> Option<Vec<u8>> {
        zstd::dict::from_samples(samples, MAX_DICTIONARY_BYTES).ok()
    }

    /// Training failed or was abandoned: collect afresh and try again later.
    pub fn training_failed(&self) {
        if let Ok(mut samples) = self.samples.lock() {
            *samples = Samples::default();
        }
        self.training.store(false, Ordering::Release);
    }

    fn dictionary(&self, conn: &Connection, id: i64) -> Result<Arc<Dictionary>, StoreError> {
        if let Some(found) = self
            .known
            .read()
            .ok()
            .and_then(|known| known.get(&id).cloned())
        {
            return Ok(found);
        }
        // Written by another process (or before this one started): dictionaries never change.
        let bytes: Vec<u8> = conn
            .query_row(
                "SELECT dictionary FROM payload_dictionaries WHERE dict_id = ?1",
                [id],
                |row| row.get(0),
            )
            .optional()
            .map_err(backend)?
            .ok_or_else(|| StoreError::Corrupt(format!("payload dictionary {id} is missing")))?;
        let dictionary = Arc::new(Dictionary { id, bytes });
        if let Ok(mut known) = self.known.write() {
            known.insert(id, dictionary.clone());
        }
        Ok(dictionary)
    }

    /// The JSON text of a stored payload.
    pub fn decode(
        &self,
        conn: &Connection,
        dict_id: Option<i64>,
        stored: rusqlite::types::ValueRef<'_>,
    ) -> Result<String, StoreError> {
        use rusqlite::types::ValueRef;
        match (dict_id, stored) {
            (None, ValueRef::Text(text)) => String::from_utf8(text.to_vec())
                .map_err(|err| StoreError::Corrupt(format!("payload is not UTF-8: {err}"))),
            (Some(id), ValueRef::Blob(frame)) => {
                let dictionary = self.dictionary(conn, id)?;
                let bytes = DECOMPRESSOR.with(|slot| {
                    let mut slot = slot.borrow_mut();
                    if !slot
                        .as_ref()
                        .is_some_and(|(cached, _)| Arc::ptr_eq(cached, &dictionary))
                    {
                        *slot = Some((
                            Arc::clone(&dictionary),
                            zstd::bulk::Decompressor::with_dictionary(&dictionary.bytes)
                                .map_err(|err| StoreError::Corrupt(err.to_string()))?,
                        ));
                    }
                    match slot.as_mut() {
                        Some((_, decompressor)) => decompressor
                            .decompress(frame, MAX_PAYLOAD_BYTES)
                            .map_err(|err| StoreError::Corrupt(format!("payload frame: {err}"))),
                        None => Err(StoreError::Corrupt("no decompressor".into())),
                    }
                })?;
                String::from_utf8(bytes)
                    .map_err(|err| StoreError::Corrupt(format!("payload is not UTF-8: {err}")))
            }
            (dict_id, other) => Err(StoreError::Corrupt(format!(
                "payload of type {:?} with dictionary {dict_id:?}",
                other.data_type()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_payloads_stay_text_and_long_ones_compress_after_training() {
        let codec = PayloadCodec::default();
        assert!(codec.encode("{\"a\":1}").is_none());
        let sample = |i: usize| {
            format!(
                "{{\"tool\":\"bash\",\"input\":{{\"command\":\"cargo test case_{i}\",\
                 \"cwd\":\"/home/agent/work\"}},\"reason\":\"check step {i} of the plan\"}}"
            )
        };
        let mut i = 0;
        while codec.take_training_samples().is_none() {
            assert!(codec.encode(&sample(i)).is_none());
            i += 1;
        }
        assert!(codec.take_training_samples().is_none(), "handed out once");
        let samples: Vec<Vec<u8>> = (0..i).map(|n| sample(n).into_bytes()).collect();
        let bytes = PayloadCodec::train(&samples).expect("trained");
        codec.install(Arc::new(Dictionary { id: 7, bytes }));
        let text = sample(100_000);
        let Some(CompressedPayload { dict_id, frame }) = codec.encode(&text) else {
            panic!("expected compression");
        };
        assert_eq!(dict_id, 7);
        assert!(
            frame.len() * 2 < text.len(),
            "{} vs {}",
            frame.len(),
            text.len()
        );
        let conn = Connection::open_in_memory().expect("memory db");
        let decoded = codec
            .decode(&conn, Some(7), rusqlite::types::ValueRef::Blob(&frame))
            .expect("decoded");
        assert_eq!(decoded, text);
    }
}
