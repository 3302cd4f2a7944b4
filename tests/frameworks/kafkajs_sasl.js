// KafkaJS over SASL_SSL, as its users configure it:
//
//     node kafkajs_sasl.js BOOTSTRAP TOPIC MECHANISM USER PASSWORD CA_FILE
//
// MECHANISM is KafkaJS' name (plain, scram-sha-256, scram-sha-512). A producer sends 50 records to TOPIC (one
// partition), then the admin client reads the partition's high watermark. Prints one JSON line: {"high": offset}, or
// {"error": the error's name} when the login is refused. Exits by itself after its deadline.
const { Kafka, logLevel } = require('kafkajs')
const fs = require('fs')

const [bootstrap, topic, mechanism, username, password, caFile] = process.argv.slice(2)
const DEADLINE_MS = 60000
setTimeout(() => {
  console.error(`kafkajs_sasl: not done in ${DEADLINE_MS} ms`)
  process.exit(3)
}, DEADLINE_MS).unref()

const kafka = new Kafka({
  clientId: 'kafkajs-sasl', brokers: [bootstrap], logLevel: logLevel.NOTHING,
  ssl: { ca: [fs.readFileSync(caFile, 'utf-8')] },
  sasl: { mechanism, username, password },
  retry: { retries: 2 },
})

async function main() {
  const producer = kafka.producer()
  await producer.connect()
  await producer.send({ topic, messages: Array.from({ length: 50 }, (_, i) => ({ value: `v${i}` })) })
  await producer.disconnect()
  const admin = kafka.admin()
  await admin.connect()
  const offsets = await admin.fetchTopicOffsets(topic)
  await admin.disconnect()
  console.log(JSON.stringify({ high: Number(offsets[0].high) }))
}

main().then(() => process.exit(0)).catch((error) => {
  console.log(JSON.stringify({ error: error.name }))
  process.exit(0)
})
