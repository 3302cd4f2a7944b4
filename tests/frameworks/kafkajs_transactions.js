// KafkaJS transactions against a broker, as its users write them:
//
//     node kafkajs_transactions.js BOOTSTRAP TOPIC INPUT_TOPIC GROUP
//
// A transactional producer commits a transaction that also commits GROUP's offset 4 of INPUT_TOPIC
// (sendOffsets), aborts one with offset 8, then commits one with offset 6 and the record "end" last. GROUP's
// offset is read (KafkaJS' admin) after the abort and at the end. Then a read_committed and a read_uncommitted
// KafkaJS consumer each read TOPIC (one partition) from the start up to "end" (the log's last record, so each
// has read everything before it). Prints one JSON line: {"committed": [values], "uncommitted": [values],
// "offsets": [GROUP's offset after the abort, at the end]}. Exits non-zero on any error, and by itself after
// its deadline.
const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, topic, inputTopic, group] = process.argv.slice(2)
const DEADLINE_MS = 90000
setTimeout(() => {
  console.error(`kafkajs_transactions: not done in ${DEADLINE_MS} ms`)
  process.exit(3)
}, DEADLINE_MS).unref()

const kafka = new Kafka({ clientId: 'kafkajs-transactions', brokers: [bootstrap], logLevel: logLevel.WARN })

function values(prefix, count) {
  return Array.from({ length: count }, (_, i) => ({ value: `${prefix}-${i}` }))
}

async function inTransaction(producer, messages, inputOffset, commit) {
  const transaction = await producer.transaction()
  await transaction.send({ topic, messages })
  await transaction.sendOffsets({
    consumerGroupId: group,
    topics: [{ topic: inputTopic, partitions: [{ partition: 0, offset: String(inputOffset) }] }],
  })
  if (commit) {
    await transaction.commit()
  } else {
    await transaction.abort()
  }
}

async function committedOffset() {
  const admin = kafka.admin()
  await admin.connect()
  try {
    const [fetched] = await admin.fetchOffsets({ groupId: group, topics: [inputTopic] })
    return Number(fetched.partitions.find(p => p.partition === 0).offset)
  } finally {
    await admin.disconnect()
  }
}

async function readToEnd(readUncommitted) {
  const consumer = kafka.consumer({ groupId: `${group}-reader-${readUncommitted}`, readUncommitted })
  const seen = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topic, fromBeginning: true })
    await new Promise((resolve, reject) => {
      consumer
        .run({
          eachMessage: async ({ message }) => {
            const value = message.value.toString()
            seen.push(value)
            if (value === 'end') resolve()
          },
        })
        .catch(reject)
    })
  } finally {
    await consumer.disconnect()
  }
  return seen
}

async function main() {
  const producer = kafka.producer({ transactionalId: 'kafkajs-writer', idempotent: true, maxInFlightRequests: 1 })
  const offsets = []
  await producer.connect()
  try {
    await inTransaction(producer, values('committed', 5), 4, true)
    await inTransaction(producer, values('aborted', 5), 8, false)
    offsets.push(await committedOffset())
    await inTransaction(producer, [...values('again', 3), { value: 'end' }], 6, true)
    offsets.push(await committedOffset())
  } finally {
    await producer.disconnect()
  }
  const committed = await readToEnd(false)
  const uncommitted = await readToEnd(true)
  console.log(JSON.stringify({ committed, uncommitted, offsets }))
}

main().then(
  () => process.exit(0),
  error => {
    console.error(error)
    process.exit(1)
  }
)
