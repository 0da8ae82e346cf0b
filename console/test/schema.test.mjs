// The console's check of a JSON answer, against the schemas the gateway's interrupts carry.
import { test } from "node:test";
import assert from "node:assert/strict";
import { check } from "../src/schema.js";

const permission = {
  type: "object",
  properties: { decision: { type: "string", enum: ["allow_once", "deny"] } },
  required: ["decision"],
  additionalProperties: false,
};
const question = {
  oneOf: [
    { type: "object", properties: { selectedId: { type: "string", const: "a" } }, required: ["selectedId"], additionalProperties: false },
    { type: "object", properties: { freeText: { type: "string", minLength: 1 } }, required: ["freeText"], additionalProperties: false },
  ],
};

test("a permission answer is one of its decisions, nothing else", () => {
  assert.equal(check(permission, { decision: "allow_once" }), null);
  assert.match(check(permission, { decision: "maybe" }), /one of "allow_once", "deny"/);
  assert.match(check(permission, {}), /needs "decision"/);
  assert.match(check(permission, { decision: "deny", extra: 1 }), /may not have "extra"/);
  assert.match(check(permission, "deny"), /must be object/);
});

test("a question takes exactly one of its shapes", () => {
  assert.equal(check(question, { selectedId: "a" }), null);
  assert.equal(check(question, { freeText: "my words" }), null);
  assert.match(check(question, { selectedId: "b" }), /none of the allowed shapes/);
  assert.match(check(question, { freeText: "" }), /none of the allowed shapes/);
  assert.match(check({ oneOf: [{ type: "string" }, { type: "string" }] }, "x"), /more than one/);
});

test("types, bounds, items and anyOf", () => {
  assert.equal(check({ type: "number" }, 3), null);
  assert.match(check({ type: "integer" }, 3.5), /must be integer/);
  assert.match(check({ type: "string", maxLength: 2 }, "abc"), /too long/);
  assert.match(check({ type: "number", minimum: 1 }, 0), /below 1/);
  assert.match(check({ type: "array", items: { type: "string" } }, ["a", 1]), /\[1\] must be string/);
  assert.equal(check({ anyOf: [{ type: "string" }, { type: "null" }] }, null), null);
  assert.equal(check(undefined, { any: "thing" }), null);
});
