// Imported first, before any schema is made: zod (which the official client validates events
// with) would otherwise try `new Function` to compile its parsers, which the console's policy
// (no eval) refuses and reports as a violation. Its interpreted parsers are used instead.
import { config } from "zod/v4";

config({ jitless: true });
