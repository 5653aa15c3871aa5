//! Unix socket connections only: a request whose `:authority` is not a URI authority
//! reaches the HTTP/2 server with `localhost` instead. An HTTP/2 header reader and
//! HPACK decoder of its own (RFC 9113, RFC 7541), in a module of its own at the bottom
//! of the house: it knows nothing of the service, only bytes in and bytes out (and
//! the `Connected` of the socket it wraps, for tonic). The gRPC door
//! (`src/grpc/mod.rs`) wraps each Unix socket connection in [`Rewritten`].
//!
//! When it can go: once h2 accepts a request whose `:authority` is not a URI
//! authority on a connection that is not TCP (hyperium/h2 pull request #487, "Do not
//! require authority for UNIX domain sockets", open since 2020; hyperium/h2#442 and
//! hyperium/tonic#243 ask the same) and tonic passes that through, or once every gRPC
//! stack sends `localhost` for a `unix:` target as grpc-go does (gRPC's C core sent
//! the percent-encoded path from 1.57 on: grpc/grpc#38142). `tests/unix_socket.rs`
//! then passes without it: delete this module and its wrap in `src/grpc/mod.rs`.
//! Fuzzed: `fuzz/fuzz_targets/h2_authority.rs` (any bytes, in any chunks, never
//! panic and stay bounded).
//!
//! Why here: a client on gRPC's C core (grpcio for Python, and the C++, Ruby, PHP and
//! C# stacks on the same core) sends a `unix:` target's path, percent-encoded, as its
//! `:authority` (`var%2Frun%2Fca-asg-provider%2Fgrpc.sock`); other stacks send the
//! bare path. The HTTP/2 server under tonic (h2) parses `:authority` as a URI
//! authority, where `/` and `%` in a host are not allowed, and resets every such
//! stream with PROTOCOL_ERROR; neither h2, hyper nor tonic has a setting to accept it.
//! grpc-go (cluster-autoscaler) sends `localhost`, which is what such a request gets
//! here.
//!
//! Why it is safe: nothing in this server reads the authority (routing is by path,
//! there are no virtual hosts), and a socket is guarded by its file's owner and mode,
//! not by any name a client sends. TCP connections, plaintext or TLS, never pass
//! through here: h2 judges their authority as before.
//!
//! How: the client's frames are read as they come. Every header block (a HEADERS frame
//! and its CONTINUATIONs) is decoded with HPACK (RFC 7541), whose compression state
//! spans the connection, so every block goes through the decoder. A connection whose
//! authorities are all valid is handed on byte for byte. From the first block with one
//! that is not, every block is encoded again without compression state (literal
//! fields, no Huffman coding, no dynamic table, so the server's decoder needs none of
//! the client's state), with `localhost` for an invalid authority. Other frames pass
//! unchanged. A block this decoder cannot read, before anything was rewritten, leaves
//! the connection to h2 from there on, byte for byte (h2 judges it as it would have);
//! once rewriting, it closes the connection. Everything is bounded: a header frame by
//! the server's frame size, a block and its decoded fields by [`MAX_BLOCK`].

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What an invalid authority becomes: grpc-go's authority for a Unix socket.
pub const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// The client preface every HTTP/2 connection starts with (RFC 9113 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest frame the server takes (its SETTINGS_MAX_FRAME_SIZE: hyper's default,
/// which the gRPC door keeps), and the largest frame written here (RFC 9113 4.2: every
/// peer takes 16,384 bytes).
const MAX_FRAME: usize = 16_384;

/// The largest header block read, encoded or decoded (the server itself refuses a
/// header list over 16 KiB).
pub const MAX_BLOCK: usize = 64 * 1024;

/// The dynamic table size the server allows the client's encoder (h2's
/// SETTINGS_HEADER_TABLE_SIZE, which this server leaves at the protocol's default).
const TABLE_LIMIT: usize = 4_096;

/// A connection's client-to-server bytes, rewritten as the module says.
#[derive(Debug)]
pub struct Rewriter {
    mode: Mode,
    /// Bytes read and not yet handled.
    input: BytesMut,
    /// Bytes of the preface still to hand on.
    preface_left: usize,
    /// Payload bytes of a frame handed on unchanged still to come.
    skip: usize,
    /// A header block waiting for its END_HEADERS.
    block: Option<Block>,
    hpack: Decoder,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every authority so far was valid: blocks are decoded and handed on unchanged.
    Watching,
    /// An authority was rewritten: every block is encoded again.
    Rewriting,
    /// Something this reader does not follow, before any rewrite: h2 gets the rest
    /// as it came.
    Untouched,
}

#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as they came, handed on when nothing needs a rewrite.
    raw: Vec<u8>,
}

/// Why a connection that was being rewritten is closed.
#[derive(Debug, thiserror::Error)]
#[error("HTTP/2 from the client over the Unix socket cannot be read: {0}")]
pub struct Unreadable(&'static str);

impl Default for Rewriter {
    fn default() -> Self {
        Self {
            mode: Mode::Watching,
            input: BytesMut::new(),
            preface_left: PREFACE.len(),
            skip: 0,
            block: None,
            hpack: Decoder::new(),
        }
    }
}

impl Rewriter {
    /// Whether some block was rewritten on this connection.
    pub fn rewrote(&self) -> bool {
        self.mode == Mode::Rewriting
    }

    /// Whether the rest of the connection passes as it comes, with nothing held back.
    fn passes_through(&self) -> bool {
        self.mode == Mode::Untouched && self.input.is_empty()
    }

    /// Takes bytes read from the client and appends what the server is to read to
    /// `out`. A frame that is not complete yet is kept for the next call.
    pub fn feed(&mut self, data: &[u8], out: &mut BytesMut) -> Result<(), Unreadable> {
        self.input.extend_from_slice(data);
        loop {
            if self.mode == Mode::Untouched {
                out.extend_from_slice(&self.input.split());
                return Ok(());
            }
            if self.preface_left > 0 {
                let n = self.preface_left.min(self.input.len());
                if n == 0 {
                    return Ok(());
                }
                let at = PREFACE.len() - self.preface_left;
                if self.input[..n] != PREFACE[at..at + n] {
                    // Not HTTP/2 with prior knowledge: the server answers it.
                    self.give_up(out, "no HTTP/2 preface")?;
                    continue;
                }
                out.extend_from_slice(&self.input.split_to(n));
                self.preface_left -= n;
                continue;
            }
            if self.skip > 0 {
                let n = self.skip.min(self.input.len());
                if n == 0 {
                    return Ok(());
                }
                out.extend_from_slice(&self.input.split_to(n));
                self.skip -= n;
                continue;
            }
            if self.input.len() < 9 {
                return Ok(());
            }
            let len = u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]]) as usize;
            let kind = self.input[3];
            if kind != HEADERS && kind != CONTINUATION {
                if self.block.is_some() {
                    self.give_up(out, "a frame inside a header block")?;
                    continue;
                }
                out.extend_from_slice(&self.input.split_to(9));
                self.skip = len;
                continue;
            }
            if len > MAX_FRAME {
                self.give_up(out, "a header frame over the frame size")?;
                continue;
            }
            if self.input.len() < 9 + len {
                return Ok(());
            }
            let frame = self.input.split_to(9 + len);
            if let Err(why) = self.header_frame(&frame, out) {
                self.give_up(out, why)?;
            }
        }
    }

    /// One complete HEADERS or CONTINUATION frame.
    fn header_frame(&mut self, frame: &[u8], out: &mut BytesMut) -> Result<(), &'static str> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[9..];
        // The frame joins the block's own bytes first: whatever happens next, it is
        // handed on with them if this reader steps aside.
        match (&mut self.block, kind) {
            (None, HEADERS) => {
                self.block = Some(Block {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority: None,
                    fragment: Vec::new(),
                    raw: frame.to_vec(),
                });
                let mut body = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let (&p, rest) = body
                        .split_first()
                        .ok_or("a padded frame without its length")?;
                    pad = p as usize;
                    body = rest;
                }
                if flags & PRIORITY != 0 {
                    let p: [u8; 5] = body
                        .get(..5)
                        .and_then(|p| p.try_into().ok())
                        .ok_or("a short priority")?;
                    self.block.as_mut().expect("just set").priority = Some(p);
                    body = &body[5..];
                }
                if pad > body.len() {
                    return Err("padding longer than the frame");
                }
                self.block.as_mut().expect("just set").fragment = body[..body.len() - pad].to_vec();
            }
            (Some(b), CONTINUATION) if b.stream == stream => {
                b.raw.extend_from_slice(frame);
                b.fragment.extend_from_slice(payload);
            }
            (Some(b), _) => {
                b.raw.extend_from_slice(frame);
                return Err("a header frame of another stream inside a header block");
            }
            (None, _) => {
                self.block = Some(Block {
                    stream,
                    end_stream: false,
                    priority: None,
                    fragment: Vec::new(),
                    raw: frame.to_vec(),
                });
                return Err("a CONTINUATION without HEADERS");
            }
        }
        let b = self.block.as_ref().expect("just set");
        if b.fragment.len() > MAX_BLOCK {
            return Err("a header block over the bound");
        }
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let fields = self.hpack.decode(&b.fragment)?;
        let invalid = |f: &Field| {
            f.name == b":authority" && http::uri::Authority::try_from(&f.value[..]).is_err()
        };
        let b = self.block.take().expect("just set");
        if self.mode == Mode::Watching && !fields.iter().any(invalid) {
            out.extend_from_slice(&b.raw);
            return Ok(());
        }
        if self.mode == Mode::Watching {
            tracing::debug!(
                authority = %String::from_utf8_lossy(&fields.iter().find(|f| invalid(f)).expect("found").value),
                "a client on the Unix socket sent an :authority that is not one; it gets localhost"
            );
        }
        self.mode = Mode::Rewriting;
        let mut block = Vec::with_capacity(b.fragment.len() + 16);
        for f in &fields {
            let value = if invalid(f) {
                LOCAL_AUTHORITY
            } else {
                &f.value[..]
            };
            encode_literal(&mut block, &f.name, value, f.sensitive);
        }
        write_block(out, b.stream, b.end_stream, b.priority, &block);
        Ok(())
    }

    /// Before any rewrite: hands on what is held and lets the rest pass. Once
    /// rewriting, the connection cannot go on.
    fn give_up(&mut self, out: &mut BytesMut, why: &'static str) -> Result<(), Unreadable> {
        if self.mode == Mode::Rewriting {
            return Err(Unreadable(why));
        }
        tracing::debug!(
            why,
            "the Unix socket's HTTP/2 reader steps aside; the server reads the rest as it comes"
        );
        self.mode = Mode::Untouched;
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.raw);
        }
        Ok(())
    }
}

/// Writes `block` as a HEADERS frame and as many CONTINUATION frames as it needs.
fn write_block(
    out: &mut BytesMut,
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: &[u8],
) {
    let first_room = MAX_FRAME - if priority.is_some() { 5 } else { 0 };
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let mut flags = if end_stream { END_STREAM } else { 0 };
    if priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let len = first.len() + if priority.is_some() { 5 } else { 0 };
    frame_header(out, len, HEADERS, flags, stream);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME));
        let flags = if after.is_empty() { END_HEADERS } else { 0 };
        frame_header(out, chunk.len(), CONTINUATION, flags, stream);
        out.extend_from_slice(chunk);
        rest = after;
    }
}

fn frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// A literal field with a literal name, not indexed (or never indexed, for a field
/// the client sent so), no Huffman coding (RFC 7541 6.2.2, 6.2.3).
fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8], sensitive: bool) {
    out.push(if sensitive { 0x10 } else { 0x00 });
    for s in [name, value] {
        encode_int(out, s.len(), 7, 0x00);
        out.extend_from_slice(s);
    }
}

/// An HPACK integer with a `prefix`-bit prefix after the bits `first` (RFC 7541 5.1).
fn encode_int(out: &mut Vec<u8>, mut v: usize, prefix: u8, first: u8) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 0x80 {
        out.push((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// Sent as "never indexed" (RFC 7541 6.2.3): kept so when encoded again.
    pub sensitive: bool,
}

/// An HPACK decoder (RFC 7541) for the client's header blocks.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first.
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max: TABLE_LIMIT,
        }
    }

    /// Decodes one complete header block, updating the dynamic table.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, &'static str> {
        let mut r = Reader { buf: block, at: 0 };
        let mut fields = Vec::new();
        let mut decoded = 0usize;
        while let Some(&b) = r.buf.get(r.at) {
            let field = if b & 0x80 != 0 {
                let (name, value) = self.get(r.int(7)?)?;
                Field {
                    name: name.to_vec(),
                    value: value.to_vec(),
                    sensitive: false,
                }
            } else if b & 0x40 != 0 {
                let name = self.name(&mut r, 6)?;
                let value = r.string()?;
                self.insert(name.clone(), value.clone());
                Field {
                    name,
                    value,
                    sensitive: false,
                }
            } else if b & 0x20 != 0 {
                // A table size update: only before the block's first field.
                if !fields.is_empty() {
                    return Err("a table size update after a field");
                }
                let size = r.int(5)?;
                if size > TABLE_LIMIT {
                    return Err("a table size over the server's setting");
                }
                self.max = size;
                self.evict(0);
                continue;
            } else {
                let sensitive = b & 0x10 != 0;
                let name = self.name(&mut r, 4)?;
                Field {
                    name,
                    value: r.string()?,
                    sensitive,
                }
            };
            decoded += field.name.len() + field.value.len() + 32;
            if decoded > MAX_BLOCK {
                return Err("a header list over the bound");
            }
            fields.push(field);
        }
        Ok(fields)
    }

    fn name(&self, r: &mut Reader<'_>, prefix: u8) -> Result<Vec<u8>, &'static str> {
        match r.int(prefix)? {
            0 => r.string(),
            i => Ok(self.get(i)?.0.to_vec()),
        }
    }

    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), &'static str> {
        match index {
            0 => Err("index 0"),
            i if i <= STATIC.len() => {
                let (n, v) = STATIC[i - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            i => self
                .table
                .get(i - STATIC.len() - 1)
                .map(|(n, v)| (&n[..], &v[..]))
                .ok_or("an index past the table"),
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            // RFC 7541 4.4: an entry larger than the table empties it.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.size += size;
        self.table.push_front((name, value));
    }

    /// Drops the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// An integer with a `prefix`-bit prefix (RFC 7541 5.1), at most 2^28 and a bit.
    fn int(&mut self, prefix: u8) -> Result<usize, &'static str> {
        let max = (1usize << prefix) - 1;
        let first = *self.buf.get(self.at).ok_or("a cut integer")?;
        self.at += 1;
        let mut v = first as usize & max;
        if v < max {
            return Ok(v);
        }
        for shift in [0, 7, 14, 21] {
            let b = *self.buf.get(self.at).ok_or("a cut integer")?;
            self.at += 1;
            v += ((b & 0x7f) as usize) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("an integer too large")
    }

    /// A string literal (RFC 7541 5.2), Huffman-coded or not.
    fn string(&mut self) -> Result<Vec<u8>, &'static str> {
        let huffman = *self.buf.get(self.at).ok_or("a cut string")? & 0x80 != 0;
        let len = self.int(7)?;
        if len > MAX_BLOCK {
            return Err("a string over the bound");
        }
        let s = self
            .buf
            .get(self.at..self.at + len)
            .ok_or("a string past the block")?;
        self.at += len;
        if huffman {
            huffman_decode(s)
        } else {
            Ok(s.to_vec())
        }
    }
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The Huffman code of RFC 7541 Appendix B, which is canonical: each code length with
/// its symbols in ascending order (256 is EOS) determines every code.
const HUFFMAN_LENGTHS: [(u8, &[u16]); 21] = [
    (5, &[48, 49, 50, 97, 99, 101, 105, 111, 115, 116]),
    (
        6,
        &[
            32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104,
            108, 109, 110, 112, 114, 117,
        ],
    ),
    (
        7,
        &[
            58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86,
            87, 89, 106, 107, 113, 118, 119, 120, 121, 122,
        ],
    ),
    (8, &[38, 42, 44, 59, 88, 90]),
    (10, &[33, 34, 40, 41, 63]),
    (11, &[39, 43, 124]),
    (12, &[35, 62]),
    (13, &[0, 36, 64, 91, 93, 126]),
    (14, &[94, 125]),
    (15, &[60, 96, 123]),
    (19, &[92, 195, 208]),
    (20, &[128, 130, 131, 162, 184, 194, 224, 226]),
    (
        21,
        &[
            153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230,
        ],
    ),
    (
        22,
        &[
            129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185,
            186, 187, 189, 190, 196, 198, 228, 232, 233,
        ],
    ),
    (
        23,
        &[
            1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166,
            168, 174, 175, 180, 182, 183, 188, 191, 197, 231, 239,
        ],
    ),
    (
        24,
        &[9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237],
    ),
    (25, &[199, 207, 234, 235]),
    (
        26,
        &[
            192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255,
        ],
    ),
    (
        27,
        &[
            203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252,
            253, 254,
        ],
    ),
    (
        28,
        &[
            2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 127, 220, 249,
        ],
    ),
    (30, &[10, 13, 22, 256]),
];

const EOS: u16 = 256;
const MAX_CODE_LEN: usize = 30;

/// Per code length: its first code and where its symbols start in [`HUFFMAN_LENGTHS`]
/// read in order.
struct Canonical {
    first: [u32; MAX_CODE_LEN + 1],
    count: [u32; MAX_CODE_LEN + 1],
    offset: [usize; MAX_CODE_LEN + 1],
    symbols: Vec<u16>,
}

fn canonical() -> &'static Canonical {
    static TABLE: OnceLock<Canonical> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut c = Canonical {
            first: [0; MAX_CODE_LEN + 1],
            count: [0; MAX_CODE_LEN + 1],
            offset: [0; MAX_CODE_LEN + 1],
            symbols: Vec::with_capacity(257),
        };
        for (len, syms) in HUFFMAN_LENGTHS {
            c.count[len as usize] = syms.len() as u32;
            c.offset[len as usize] = c.symbols.len();
            c.symbols.extend_from_slice(syms);
        }
        let mut code = 0u32;
        for len in 1..=MAX_CODE_LEN {
            c.first[len] = code;
            code = (code + c.count[len]) << 1;
        }
        c
    })
}

/// Decodes a Huffman-coded string (RFC 7541 5.2): EOS inside it, or padding that is
/// longer than 7 bits or not all ones, is an error.
fn huffman_decode(coded: &[u8]) -> Result<Vec<u8>, &'static str> {
    let c = canonical();
    let mut out = Vec::with_capacity(coded.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for byte in coded {
        for bit in (0..8).rev() {
            code = (code << 1) | ((*byte >> bit) & 1) as u32;
            len += 1;
            let at = code.wrapping_sub(c.first[len]);
            if at < c.count[len] {
                let sym = c.symbols[c.offset[len] + at as usize];
                if sym == EOS {
                    return Err("EOS inside a Huffman string");
                }
                out.push(sym as u8);
                (code, len) = (0, 0);
            } else if len == MAX_CODE_LEN {
                return Err("not a Huffman code");
            }
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err("bad Huffman padding");
    }
    Ok(out)
}

/// A Unix socket connection whose client bytes go through a [`Rewriter`].
pub struct Rewritten<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes the server has not read yet.
    ready: BytesMut,
    read: Box<[u8]>,
    eof: bool,
}

impl<S> Rewritten<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            ready: BytesMut::new(),
            read: vec![0; 16 * 1024].into_boxed_slice(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewritten<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = buf.remaining().min(this.ready.len());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passes_through() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut rb = ReadBuf::new(&mut this.read);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            if rb.filled().is_empty() {
                this.eof = true;
                continue;
            }
            let n = rb.filled().len();
            this.rewriter
                .feed(&this.read[..n], &mut this.ready)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewritten<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Rewritten<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
