#!/usr/bin/env python3
"""Regenerates crates/engine/tests/data/canonical-vectors.json with python3's own json module.

Each vector holds a raw JSON document, the canonical form Python produces with
json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":")), and its SHA-256.
The gateway's digests must be byte-identical to Python's, so state files stay interchangeable.
"""
import hashlib
import json
import pathlib

RAW = [
    '{"b":1,"a":[1.0,"é",null,true]}',
    '{"z":{"y":{"x":[{"b":2,"a":1}]}},"a":"\\u00e9\\n\\t\\"\\\\/"}',
    '[1.0, 1e-05, 1e+16, 1E16, 1e15, 0.1, -0.0, 0, -0, 123456789012345678901234567890, 2.5e-7, 1.5e300, 3.14159265358979]',
    '{"unicode":"中文 日本語 emoji \\ud83d\\ude00 raw 😀","ctrl":"\\u0001\\u001f\\u007f\\b\\f"}',
    '{"threadId":"t1","runId":"r1","state":{},"messages":[{"id":"m","role":"user","content":"hi"}],"tools":[],"context":[],"forwardedProps":{"iacCode":{"schemaVersion":1,"rosInvocationId":"inv","cwd":"/tmp/x"}}}',
    '{"Z":1,"a":2,"_":3,"é":4,"~":5,"\\u00ff":6,"\\ud83d\\ude00":7,"\\uffff":8}',
    '{"nested":[[[],{}],[{"k":[1,2,{"q":null}]}]],"big":18446744073709551616,"neg":-9223372036854775809}',
    '{"f":[0.5,100.0,1e22,1e-7,5e-324,1.7976931348623157e308,9007199254740993]}',
]

vectors = []
for raw in RAW:
    v = json.loads(raw)
    canon = json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    vectors.append({
        "raw": raw,
        "canonical": canon,
        "sha256": hashlib.sha256(canon.encode("utf-8")).hexdigest(),
    })

out = pathlib.Path(__file__).resolve().parent.parent / "crates/engine/tests/data/canonical-vectors.json"
out.write_text(json.dumps(vectors, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
print(f"wrote {len(vectors)} vectors to {out}")
