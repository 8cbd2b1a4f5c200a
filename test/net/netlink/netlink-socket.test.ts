// The addon's netlink socket under the `netlink` package's framing
// (agent/net/netlink-socket.ts): requests, multipart dumps and kernel errors
// through the package's NetlinkSocket/RtNetlinkSocket, as the agent uses
// them. Unprivileged: reading links and getting an error back need no
// capability (changes are tested in test/privileged/net-macvlan.test.ts).
import t from 'tap';
import { Protocol } from 'netlink/dist/constants';
import { NetlinkSocket } from 'netlink/dist/netlink';
import type { RawNetlinkSocket as PackageRawSocket } from 'netlink/dist/raw';
import { RtNetlinkSocket } from 'netlink/dist/rt/rt';
import { FlagsGet } from 'netlink/dist/constants';
import { RawNetlinkSocket } from '../../../agent/net/netlink/netlink-socket';
import { loadNative } from '../../../agent/native/native';

function open(): { raw: RawNetlinkSocket; rt: RtNetlinkSocket } {
  const raw = new RawNetlinkSocket(Protocol.ROUTE, { recvBufferSize: 1 << 20 });
  return { raw, rt: new RtNetlinkSocket(new NetlinkSocket(raw as unknown as PackageRawSocket)) };
}

t.test('the addon provides the socket class', async (t) => {
  t.type(loadNative().NetlinkHandle, 'function', 'NetlinkHandle in lbagent_native.node');
  const { raw } = open();
  const a = raw.address();
  t.ok(a.port > 0, `bound to a port the kernel chose (${a.port})`);
  let closed = 0;
  raw.on('close', () => closed++);
  raw.close();
  raw.close();
  t.equal(closed, 1, "'close' once");
});

t.test('a dump of every link comes back whole, through the package\'s framing', async (t) => {
  const { raw, rt } = open();
  t.teardown(() => raw.close());
  const links = await rt.getLinks({}, {}, { flags: FlagsGet.DUMP, timeout: 5000 });
  const names = links.map((l) => l.attrs.ifname);
  t.ok(names.includes('lo'), `lo among ${names.length} links`);
  // Several dumps in a row on one socket: sequence numbers and DONE handled each time.
  for (let i = 0; i < 3; i++) t.equal((await rt.getLinks({}, {}, { flags: FlagsGet.DUMP, timeout: 5000 })).length, links.length);
});

t.test('a request the kernel refuses rejects with its errno', async (t) => {
  const { raw, rt } = open();
  t.teardown(() => raw.close());
  // RTM_GETLINK for an index that does not exist: ENODEV in the ACK.
  await t.rejects(rt.getLink({ index: 0x7ffffff0 }, {}, { timeout: 5000 }), /ENODEV/);
  // The socket works on after the error.
  t.ok((await rt.getLinks({}, {}, { flags: FlagsGet.DUMP, timeout: 5000 })).length > 0);
});

t.test('a send on a closed socket fails through the callback, not a throw', async (t) => {
  const { raw } = open();
  raw.close();
  const err = await new Promise<Error | undefined>((resolve) => raw.send(Buffer.alloc(16), {}, resolve));
  t.match(err, { code: 'EBADF' });
});
