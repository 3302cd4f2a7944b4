// @platformatic/kafka against a broker, as its users write it:
//
//     NODE_PATH=DIR/node_modules node platformatic_kafka.mjs BOOTSTRAP TOPIC GROUP COUNT
//
// (An ES module does not search NODE_PATH itself: the package is resolved from there by hand.)
// Its Admin creates TOPIC (3 partitions) and a second topic TOPIC-gone, lists both in its metadata (with their
// topic ids), deletes TOPIC-gone and sees it gone. Its idempotent Producer sends COUNT keyed records to TOPIC; two
// Consumers in GROUP read them (from the earliest offset, autocommit) until every record arrived, then
// close. Prints one JSON line: {"created": [names], "topicIds": {name: id}, "afterDelete": [names],
// "consumed": {memberIndex: [values]}, "partitionsByMember": {memberIndex: [partitions]}}.
// Exits non-zero on any error, and by itself after its deadline.
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const modules = process.env.NODE_PATH
const resolved = createRequire(join(modules, 'resolve-from-here.js')).resolve('@platformatic/kafka')
const { Admin, Consumer, MessagesStreamModes, Producer, stringDeserializers, stringSerializers } =
  await import(pathToFileURL(resolved))

const [bootstrap, topic, group, countText] = process.argv.slice(2)
const count = Number(countText)
const DEADLINE_MS = 90000
setTimeout(() => {
  console.error(`platformatic_kafka: not done in ${DEADLINE_MS} ms`)
  process.exit(3)
}, DEADLINE_MS).unref()

const common = { bootstrapBrokers: [bootstrap], retries: 5, retryDelay: 200 }
const gone = `${topic}-gone`
const result = {}

const admin = new Admin({ ...common, clientId: 'plt-admin' })
await admin.createTopics({ topics: [topic, gone], partitions: 3, replicas: 1 })
const metadata = await admin.metadata({ topics: [topic, gone] })
result.created = [...metadata.topics.keys()].sort()
result.topicIds = Object.fromEntries([...metadata.topics.entries()].map(([name, t]) => [name, t.id]))
await admin.deleteTopics({ topics: [gone] })
const listed = await admin.listTopics()
result.afterDelete = listed.filter(name => name === topic || name === gone).sort()
await admin.close()

// Idempotent, as a producer that must not duplicate on retries is: it asks InitProducerId v3+ for its id.
const producer = new Producer({ ...common, clientId: 'plt-producer', serializers: stringSerializers, idempotent: true })
const messages = Array.from({ length: count }, (_, i) => ({ topic, key: `k${i}`, value: `v${i}` }))
await producer.send({ messages, acks: -1 })
await producer.close()

result.consumed = {}
result.partitionsByMember = {}
let total = 0
let allDone
const done = new Promise(resolve => { allDone = resolve })
const consumers = []
for (const member of [0, 1]) {
  const consumer = new Consumer({
    ...common,
    clientId: `plt-consumer-${member}`,
    groupId: group,
    deserializers: stringDeserializers,
    sessionTimeout: 10000,
    heartbeatInterval: 500,
    maxWaitTime: 200
  })
  consumers.push(consumer)
  result.consumed[member] = []
  const seenPartitions = new Set()
  const stream = await consumer.consume({ topics: [topic], mode: MessagesStreamModes.EARLIEST, autocommit: 100 })
  stream.on('data', message => {
    result.consumed[member].push(message.value)
    seenPartitions.add(message.partition)
    result.partitionsByMember[member] = [...seenPartitions].sort()
    total += 1
    if (total >= count) allDone()
  })
  stream.on('error', error => {
    console.error(`consumer ${member}: ${error.stack}`)
    process.exit(2)
  })
}
await done
for (const consumer of consumers) await consumer.close(true)
console.log(JSON.stringify(result))
