// Identifiers (effect keys, run ids, tool names) in the pages' forms.  A key
// or a run id is chosen by an agent and may hold any character; a browser
// submits a line feed in a form value as CR LF, and collapses the white space
// of an <option> without a value, so a form that carried one as it is could
// name another key, run or tool.  The forms carry base64url of its UTF-8
// bytes instead, which a browser sends as it is; what does not decode is
// refused (the console's forms never send it).

export function encodeId(value) {
  return Buffer.from(String(value ?? ''), 'utf8').toString('base64url');
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** The identifier a form field carries, or null when it is not one of encodeId's. */
export function decodeId(value) {
  if (typeof value !== 'string' || !/^[A-Za-z0-9_-]*$/.test(value)) return null;
  const bytes = Buffer.from(value, 'base64url');
  if (bytes.toString('base64url') !== value) return null;
  try {
    return utf8.decode(bytes);
  } catch {
    return null;
  }
}
