//! A minimal Server-Sent Events parser: `id:`, `event:`, `data:` and comment lines out of a byte
//! stream cut anywhere. The stream-latency phase feeds it the chunks as the socket gives them, so
//! an event is timestamped when the chunk that completed it arrived.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    /// `message` when the event named none.
    pub event: String,
    pub data: String,
}

/// Incremental parser state: the unfinished line and the fields of the event being read.
#[derive(Default)]
pub struct SseParser {
    pending: Vec<u8>,
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
    /// Comment lines seen (`: keep-alive`).
    pub comments: u64,
}

impl SseParser {
    /// Feed one chunk; every event it completes is appended to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) {
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(offset) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + offset;
            let mut line = &self.pending[start..end];
            if let Some(stripped) = line.strip_suffix(b"\r") {
                line = stripped;
            }
            let line = String::from_utf8_lossy(line).into_owned();
            self.line(&line, out);
            start = end + 1;
        }
        self.pending.drain(..start);
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            // Dispatch. An event with no data line is not dispatched (the SSE rules).
            if let Some(data) = self.data.take() {
                out.push(SseEvent {
                    id: self.id.clone(),
                    event: self.event.take().unwrap_or_else(|| "message".to_owned()),
                    data,
                });
            }
            self.event = None;
            return;
        }
        if line.starts_with(':') {
            self.comments += 1;
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "id" => self.id = Some(value.to_owned()),
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            // `retry:` and unknown fields are ignored.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(text: &str, piece: usize) -> (Vec<SseEvent>, u64) {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(piece) {
            parser.push(chunk, &mut out);
        }
        (out, parser.comments)
    }

    #[test]
    fn events_survive_any_chunking() {
        let text = ": keep-alive\n\nevent: change\nid: 7\ndata: {\"changeId\":7}\n\n\
                    event: change\r\nid: 8\r\ndata: a\r\ndata: b\r\n\r\n";
        for piece in [1, 2, 3, 5, 8, 13, text.len()] {
            let (events, comments) = parse_in_pieces(text, piece);
            assert_eq!(comments, 1);
            assert_eq!(
                events,
                vec![
                    SseEvent {
                        id: Some("7".into()),
                        event: "change".into(),
                        data: "{\"changeId\":7}".into()
                    },
                    SseEvent {
                        id: Some("8".into()),
                        event: "change".into(),
                        data: "a\nb".into()
                    },
                ],
                "chunks of {piece}"
            );
        }
    }

    #[test]
    fn an_unfinished_event_is_not_dispatched() {
        let (events, _) = parse_in_pieces("event: change\nid: 1\ndata: x\n", 4);
        assert!(events.is_empty());
    }
}
