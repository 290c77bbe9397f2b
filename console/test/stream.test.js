// The live stream on its own (no database): a burst of notifications while
// the browser reads nothing costs one event, not one write each, and a
// person's open streams are capped.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { openStream } from '../src/stream.js';

class FakeResponse extends EventEmitter {
  constructor() {
    super();
    this.writes = [];
    this.writableNeedDrain = false;
    this.ended = false;
  }
  writeHead() {}
  write(chunk) { this.writes.push(chunk); }
  end() { this.ended = true; }
  events() { return this.writes.filter((w) => w.startsWith('event: attention')).length; }
}

const person = () => ({ streams: new Set() });
const waitFor = async (check) => {
  while (!check()) await new Promise((r) => setTimeout(r, 10));
};

test('a burst of notifications while the browser does not read is one event once it reads again', async () => {
  const who = person();
  const req = new EventEmitter();
  const res = new FakeResponse();
  openStream(who, req, res);
  const [stream] = who.streams;
  stream.notify();
  assert.equal(res.events(), 1, 'the first is sent at once');
  res.writableNeedDrain = true;
  for (let i = 0; i < 100000; i += 1) stream.notify();
  await new Promise((r) => setTimeout(r, 300));  // past the gap: still nothing, the browser is not reading
  assert.equal(res.events(), 1, 'nothing is queued while the browser does not read');
  res.writableNeedDrain = false;
  res.emit('drain');
  await waitFor(() => res.events() === 2);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(res.events(), 2, 'the burst became one event');
  req.emit('close');
  assert.equal(who.streams.size, 0);
});

test('notifications closer than the gap are one event', async () => {
  const who = person();
  const req = new EventEmitter();
  const res = new FakeResponse();
  openStream(who, req, res);
  const [stream] = who.streams;
  for (let i = 0; i < 1000; i += 1) stream.notify();
  await waitFor(() => res.events() === 2);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(res.events(), 2, 'the first at once, the rest as one after the gap');
  req.emit('close');
});

test('a person has at most eight open streams: a ninth ends the oldest', () => {
  const who = person();
  const responses = [];
  for (let i = 0; i < 9; i += 1) {
    const res = new FakeResponse();
    responses.push(res);
    openStream(who, new EventEmitter(), res);
  }
  assert.equal(who.streams.size, 8);
  assert.equal(responses[0].ended, true);
  assert.equal(responses[1].ended, false);
});
