"""The group coordinator of Kafka's classic protocol, in the timer process."""
