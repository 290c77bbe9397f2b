// A person's live stream (server-sent events): one "attention" event when the
// ledger notified their connection, at most one per quarter second, and none
// queued while the browser is not reading (a burst of notifications, forged
// or real, costs one event, not one write each).
const MIN_GAP_MS = 250;
const HEARTBEAT_MS = 20000;
// a person's open pages that listen at once; a new one ends the oldest
const MAX_STREAMS = 8;

export function openStream(person, req, res) {
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
  });
  res.write(': the ledger\'s attention channel\n\n');
  let pending = false;
  let gap = null;
  const send = () => {
    if (res.writableNeedDrain) {
      pending = true;  // sent on 'drain'
      return;
    }
    pending = false;
    res.write('event: attention\ndata: changed\n\n');
    gap = setTimeout(() => {
      gap = null;
      if (pending) send();
    }, MIN_GAP_MS);
  };
  const stream = {
    notify() {
      if (gap || res.writableNeedDrain) pending = true;
      else send();
    },
    end() {
      res.end();
    },
  };
  res.on('drain', () => {
    if (pending && !gap) send();
  });
  const heartbeat = setInterval(() => {
    if (!res.writableNeedDrain) res.write(': still here\n\n');
  }, HEARTBEAT_MS);
  heartbeat.unref();
  if (person.streams.size >= MAX_STREAMS) {
    const oldest = person.streams.values().next().value;
    person.streams.delete(oldest);
    oldest.end();
  }
  person.streams.add(stream);
  req.on('close', () => {
    clearInterval(heartbeat);
    clearTimeout(gap);
    person.streams.delete(stream);
  });
}
