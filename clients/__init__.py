"""Client-side packages of shmbroker, apart from the server: they use only public Kafka clients and import
nothing of the node."""
