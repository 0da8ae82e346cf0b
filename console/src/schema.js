// A small JSON Schema check of an interrupt's answer before it is sent (the gateway checks it
// again): the keywords interrupts use — type, enum, const, required, properties,
// additionalProperties, items, minLength, maxLength, minimum, maximum, oneOf, anyOf, allOf.
// Returns the first problem found, or null.

function typeOf(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

function typeMatches(want, v) {
  const t = typeOf(v);
  return want === t || (want === "number" && t === "integer");
}

export function check(schema, v, at = "the answer") {
  if (schema === true || schema === undefined || schema === null) return null;
  if (schema === false) return `${at} is not allowed`;
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => typeMatches(t, v))) return `${at} must be ${types.join(" or ")}`;
  }
  if (schema.const !== undefined && JSON.stringify(schema.const) !== JSON.stringify(v)) {
    return `${at} must be ${JSON.stringify(schema.const)}`;
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) {
    return `${at} must be one of ${schema.enum.map((e) => JSON.stringify(e)).join(", ")}`;
  }
  if (typeof v === "string") {
    if (schema.minLength !== undefined && [...v].length < schema.minLength) return `${at} is too short`;
    if (schema.maxLength !== undefined && [...v].length > schema.maxLength) return `${at} is too long`;
  }
  if (typeof v === "number") {
    if (schema.minimum !== undefined && v < schema.minimum) return `${at} is below ${schema.minimum}`;
    if (schema.maximum !== undefined && v > schema.maximum) return `${at} is above ${schema.maximum}`;
  }
  if (typeOf(v) === "object") {
    for (const k of schema.required ?? []) if (!(k in v)) return `${at} needs "${k}"`;
    const props = schema.properties ?? {};
    for (const [k, value] of Object.entries(v)) {
      if (k in props) {
        const e = check(props[k], value, `"${k}"`);
        if (e) return e;
      } else if (schema.additionalProperties === false) {
        return `${at} may not have "${k}"`;
      } else if (typeof schema.additionalProperties === "object") {
        const e = check(schema.additionalProperties, value, `"${k}"`);
        if (e) return e;
      }
    }
  }
  if (Array.isArray(v) && schema.items !== undefined) {
    for (let i = 0; i < v.length; i++) {
      const e = check(schema.items, v[i], `${at}[${i}]`);
      if (e) return e;
    }
  }
  for (const s of schema.allOf ?? []) {
    const e = check(s, v, at);
    if (e) return e;
  }
  if (Array.isArray(schema.anyOf) && !schema.anyOf.some((s) => check(s, v, at) === null)) {
    return `${at} matches none of the allowed shapes`;
  }
  if (Array.isArray(schema.oneOf)) {
    const n = schema.oneOf.filter((s) => check(s, v, at) === null).length;
    if (n !== 1) return n === 0 ? `${at} matches none of the allowed shapes` : `${at} matches more than one shape`;
  }
  return null;
}
