//! The Unix socket's authority rewrite: HPACK as RFC 7541 decodes it, and a
//! connection handed on byte for byte unless an authority is not one.
use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn field(name: &str, value: &str) -> Field {
    Field {
        name: name.into(),
        value: value.into(),
        sensitive: false,
    }
}

/// The test's own Huffman encoder, from the same canonical table.
fn huffman_encode(s: &[u8]) -> Vec<u8> {
    let c = canonical();
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0u32);
    for &b in s {
        let len = HUFFMAN_LENGTHS
            .iter()
            .find(|(_, syms)| syms.contains(&(b as u16)))
            .unwrap()
            .0 as usize;
        let at = c.symbols[c.offset[len]..c.offset[len] + c.count[len] as usize]
            .iter()
            .position(|&x| x == b as u16)
            .unwrap();
        acc = (acc << len) | (c.first[len] as u64 + at as u64);
        bits += len as u32;
        while bits >= 8 {
            out.push((acc >> (bits - 8)) as u8);
            bits -= 8;
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) as u8) | ((1u8 << (8 - bits)) - 1));
    }
    out
}

#[test]
fn the_huffman_code_is_complete_and_decodes_the_rfc_examples() {
    // 257 symbols whose code lengths fill the code space exactly (Kraft's sum is 1).
    let symbols: usize = HUFFMAN_LENGTHS.iter().map(|(_, s)| s.len()).sum();
    assert_eq!(symbols, 257);
    let space: u64 = HUFFMAN_LENGTHS
        .iter()
        .map(|(len, s)| s.len() as u64 * (1u64 << (30 - *len as u32)))
        .sum();
    assert_eq!(space, 1 << 30);
    // RFC 7541 C.4 and C.6.
    for (coded, plain) in [
        ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
        ("a8eb 1064 9cbf", "no-cache"),
        ("25a8 49e9 5ba9 7d7f", "custom-key"),
        ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
        ("6402", "302"),
        ("aec3 771a 4b", "private"),
        (
            "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            "Mon, 21 Oct 2013 20:13:21 GMT",
        ),
        (
            "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
            "https://www.example.com",
        ),
    ] {
        assert_eq!(huffman_decode(&hex(coded)).unwrap(), plain.as_bytes());
        assert_eq!(huffman_encode(plain.as_bytes()), hex(coded));
    }
    let every: Vec<u8> = (0..=255).collect();
    assert_eq!(huffman_decode(&huffman_encode(&every)).unwrap(), every);
    // Padding of 8 bits or more, padding that is not all ones, and EOS itself.
    assert!(huffman_decode(&hex("6402 ff")).is_err());
    assert!(huffman_decode(&hex("64")).is_err());
    assert!(huffman_decode(&hex("ffff fffc")).is_err());
}

#[test]
fn decodes_the_rfc_requests_through_the_dynamic_table() {
    // RFC 7541 C.4: three requests on one connection, the last two indexing the first's.
    let mut d = Decoder::new();
    let first = d
        .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
        .unwrap();
    assert_eq!(
        first,
        [
            field(":method", "GET"),
            field(":scheme", "http"),
            field(":path", "/"),
            field(":authority", "www.example.com"),
        ]
    );
    let second = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
    assert_eq!(second[3], field(":authority", "www.example.com"));
    assert_eq!(second[4], field("cache-control", "no-cache"));
    let third = d
        .decode(&hex(
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ))
        .unwrap();
    assert_eq!(
        third,
        [
            field(":method", "GET"),
            field(":scheme", "https"),
            field(":path", "/index.html"),
            field(":authority", "www.example.com"),
            field("custom-key", "custom-value"),
        ]
    );
    assert_eq!(d.size, 164, "the RFC's table size after C.4.3");
    // An index past the table, a size update over the server's setting or after a
    // field, and a cut string are errors.
    assert!(d.decode(&hex("c5")).is_err());
    assert!(Decoder::new().decode(&hex("3fe2 1f")).is_err());
    assert!(Decoder::new().decode(&hex("82 20")).is_err());
    assert!(Decoder::new().decode(&hex("41 8c f1e3")).is_err());
}

const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out.to_vec()
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_int(&mut out, s.len(), 7, 0);
    out.extend_from_slice(s);
    out
}

/// A first gRPC request as a client encodes it: fields added to the dynamic table.
fn first_request(authority: &[u8], huffman: bool) -> Vec<u8> {
    let mut b = vec![0x83, 0x86, 0x44];
    b.extend(string(
        b"/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroups",
    ));
    b.push(0x41);
    if huffman {
        let coded = huffman_encode(authority);
        encode_int(&mut b, coded.len(), 7, 0x80);
        b.extend(coded);
    } else {
        b.extend(string(authority));
    }
    b.push(0x40);
    b.extend(string(b"te"));
    b.extend(string(b"trailers"));
    b.push(0x5f);
    b.extend(string(b"application/grpc"));
    b
}

/// The same request again, every field from the dynamic table.
const SECOND_REQUEST: &[u8] = &[0x83, 0x86, 0xc1, 0xc0, 0xbf, 0xbe];

const DATA: &[u8] = &[0, 0, 0, 0, 0];

fn connection(authority: &[u8], huffman: bool) -> Vec<u8> {
    let mut c = PREFACE.to_vec();
    c.extend(SETTINGS);
    c.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &first_request(authority, huffman),
    ));
    c.extend(frame(0x0, END_STREAM, 1, DATA));
    c.extend(frame(HEADERS, END_HEADERS, 3, SECOND_REQUEST));
    c.extend(frame(0x0, END_STREAM, 3, DATA));
    c
}

/// Everything the server reads, fed `step` bytes at a time.
fn rewrite(input: &[u8], step: usize) -> (Vec<u8>, Rewriter) {
    let mut r = Rewriter::default();
    let mut out = BytesMut::new();
    for chunk in input.chunks(step) {
        r.feed(chunk, &mut out).unwrap();
    }
    (out.to_vec(), r)
}

/// The frames of a server-side byte stream after its preface: (type, flags, stream,
/// payload).
fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert!(bytes.starts_with(PREFACE));
    let mut rest = &bytes[PREFACE.len()..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        out.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    out
}

#[test]
fn a_connection_whose_authority_is_valid_reaches_the_server_byte_for_byte() {
    for authority in [
        &b"localhost"[..],
        b"127.0.0.1:8086",
        b"ca-asg-provider.kube-system.svc:8086",
    ] {
        for huffman in [false, true] {
            let input = connection(authority, huffman);
            for step in [1, 7, input.len()] {
                let (out, r) = rewrite(&input, step);
                assert_eq!(out, input, "{authority:?} huffman={huffman} step={step}");
                assert!(!r.rewrote());
            }
        }
    }
}

/// What gRPC's C core sends for `unix:///tmp/x.sock` (grpcio 1.85), and the bare path
/// other stacks send: the server reads `localhost` in every request of the
/// connection, the indexed ones too, and everything else as the client sent it.
#[test]
fn an_authority_that_is_a_socket_path_reaches_the_server_as_localhost() {
    for authority in [
        &b"tmp%2Fx.sock"[..],
        b"/var/run/ca-asg-provider/grpc.sock",
        b"",
    ] {
        for huffman in [false, true] {
            let input = connection(authority, huffman);
            let (out, r) = rewrite(&input, input.len());
            assert!(r.rewrote());
            for step in [1, 5, 64] {
                assert_eq!(rewrite(&input, step).0, out, "the same whatever the reads");
            }
            let f = frames(&out);
            assert_eq!(f.len(), 5, "{f:?}");
            assert_eq!(f[0], (4, 0, 0, vec![]), "SETTINGS unchanged");
            assert_eq!(f[2], (0, END_STREAM, 1, DATA.to_vec()), "DATA unchanged");
            assert_eq!(f[4], (0, END_STREAM, 3, DATA.to_vec()));
            // The server's decoder needs no state of the client's: each block alone.
            for (i, stream) in [(1, 1), (3, 3)] {
                assert_eq!((f[i].0, f[i].1, f[i].2), (HEADERS, END_HEADERS, stream));
                let fields = Decoder::new().decode(&f[i].3).unwrap();
                assert_eq!(
                    fields,
                    [
                        field(":method", "POST"),
                        field(":scheme", "http"),
                        field(
                            ":path",
                            "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroups"
                        ),
                        field(":authority", "localhost"),
                        field("te", "trailers"),
                        field("content-type", "application/grpc"),
                    ]
                );
            }
        }
    }
}

#[test]
fn a_rewritten_block_keeps_its_stream_end_priority_and_sensitive_fields_and_drops_padding() {
    let mut block = first_request(b"tmp%2Fx.sock", false);
    // A never-indexed field, as a client marks a secret.
    block.push(0x10);
    block.extend(string(b"authorization"));
    block.extend(string(b"secret"));
    let mut payload = vec![3u8]; // pad length
    payload.extend([0x80, 0, 0, 1, 15]); // exclusive dependency on stream 1, weight 16
    payload.extend(&block);
    payload.extend([0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM | PADDED | PRIORITY,
        5,
        &payload,
    ));
    let (out, _) = rewrite(&input, 3);
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].1, END_HEADERS | END_STREAM | PRIORITY);
    assert_eq!(f[0].3[..5], [0x80, 0, 0, 1, 15]);
    let fields = Decoder::new().decode(&f[0].3[5..]).unwrap();
    assert_eq!(fields[3], field(":authority", "localhost"));
    assert_eq!(
        fields[6],
        Field {
            name: b"authorization".to_vec(),
            value: b"secret".to_vec(),
            sensitive: true
        }
    );
}

#[test]
fn a_block_over_continuations_is_read_whole_and_written_in_frames_the_server_takes() {
    let mut block = first_request(b"tmp%2Fx.sock", false);
    block.push(0x00);
    block.extend(string(b"x-big"));
    block.extend(string(&vec![b'a'; 40_000]));
    let mut input = PREFACE.to_vec();
    let chunks: Vec<&[u8]> = block.chunks(10_000).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        input.extend(frame(kind, if last { END_HEADERS } else { 0 }, 1, c));
    }
    let (out, _) = rewrite(&input, 4096);
    let f = frames(&out);
    assert!(f.len() >= 3);
    assert!(f.iter().all(|f| f.3.len() <= MAX_FRAME));
    assert_eq!(f[0].0, HEADERS);
    assert!(f[1..].iter().all(|f| f.0 == CONTINUATION && f.2 == 1));
    assert!(f[..f.len() - 1].iter().all(|f| f.1 & END_HEADERS == 0));
    assert_eq!(f.last().unwrap().1, END_HEADERS);
    let whole: Vec<u8> = f.iter().flat_map(|f| f.3.clone()).collect();
    let fields = Decoder::new().decode(&whole).unwrap();
    assert_eq!(fields[3], field(":authority", "localhost"));
    assert_eq!(fields[6].value.len(), 40_000);
}

#[test]
fn what_this_reader_does_not_follow_reaches_the_server_as_it_came_until_a_rewrite() {
    // Not HTTP/2 at all.
    let junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    assert_eq!(rewrite(&junk, 3).0, junk);
    // A block this decoder cannot read (an index past the table), then a request
    // with a path for an authority: h2 judges both, as it would without this reader.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &[0x83, 0xff, 0x10]));
    input.extend(connection(b"tmp%2Fx.sock", false)[PREFACE.len()..].to_vec());
    let (out, r) = rewrite(&input, 11);
    assert_eq!(out, input);
    assert!(!r.rewrote());
    // A CONTINUATION of another stream inside a block: handed on as it came.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &[0x83]));
    input.extend(frame(CONTINUATION, END_HEADERS, 3, &[0x86]));
    assert_eq!(rewrite(&input, 5).0, input);
    // Once rewriting, a block it cannot read closes the connection.
    let mut input = connection(b"tmp%2Fx.sock", false);
    input.extend(frame(HEADERS, END_HEADERS, 5, &[0x83, 0xff, 0x10]));
    let mut r = Rewriter::default();
    let e = r.feed(&input, &mut BytesMut::new()).unwrap_err();
    assert!(e.to_string().contains("index past the table"), "{e}");
}

proptest::proptest! {
    /// Any bytes after the preface, in any reads: no panic, and unless a block was
    /// rewritten the server reads exactly what came (so far).
    #[test]
    fn any_bytes_in_any_reads_are_handed_on_unchanged_unless_rewritten(
        body in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
        step in 1usize..64,
    ) {
        let mut input = PREFACE.to_vec();
        input.extend(&body);
        let mut r = Rewriter::default();
        let mut out = BytesMut::new();
        for chunk in input.chunks(step) {
            if r.feed(chunk, &mut out).is_err() {
                break;
            }
        }
        if !r.rewrote() {
            proptest::prop_assert!(input.starts_with(&out));
        }
    }
}
