// Closing while frames are still in flight, with amqplib (issue 11, items 1-2).
// Usage: node close_handshake.js AMQP_URL. Prints "ok" and exits 0, or prints the error.
'use strict';
const amqp = require('amqplib');

async function closeWhilePublishing(url) {
  // 2,000 sendToQueue calls buffered, then close: the broker must read on to our close.
  const conn = await amqp.connect(url);
  conn.on('error', (err) => { throw err; });
  const ch = await conn.createChannel();
  await ch.assertQueue('node-close', { durable: false });
  for (let i = 0; i < 2000; i++) ch.sendToQueue('node-close', Buffer.from('m' + i));
  await conn.close();
}

async function closeConfirmChannel(url) {
  // 1,000 confirms owed when the channel closes: nothing may follow its close-ok.
  const conn = await amqp.connect(url);
  let failure = null;
  conn.on('error', (err) => { failure = err; });
  const ch = await conn.createConfirmChannel();
  await ch.assertQueue('node-confirm', { durable: false });
  for (let i = 0; i < 1000; i++) ch.sendToQueue('node-confirm', Buffer.from('c' + i));
  await ch.close();
  // A frame on the closed channel would arrive about now: give it a round trip.
  const other = await conn.createChannel();
  await other.checkQueue('node-confirm');
  await other.close();
  await conn.close();
  if (failure) throw failure;
}

(async () => {
  const url = process.argv[2];
  await closeWhilePublishing(url);
  await closeConfirmChannel(url);
  console.log('ok');
})().catch((err) => {
  console.log('failed: ' + (err && err.stack ? err.stack : err));
  process.exit(1);
});
