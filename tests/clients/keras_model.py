"""The small Keras classifier the TensorFlow clients of this folder train."""


def small_classifier(tf, features, hidden, classes):
    """Two dense layers, compiled with SGD, on one thread each for inter-
    and intra-op work (the test machines are small and shared), seeded."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.random.set_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(features,)),
        tf.keras.layers.Dense(hidden, activation="relu"),
        tf.keras.layers.Dense(classes),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
