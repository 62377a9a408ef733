"""Databricks' documented HorovodRunner examples, in their shape, as a
notebook has them (imports at the top level, captured by the functions), with
scikit-learn's digits standing in for MNIST (no downloads here). The tests
run them unchanged apart from the HorovodRunner import:

- "Distributed deep learning with HorovodRunner for MNIST" (TensorFlow and
  Keras): ``get_dataset``, ``get_model``, ``train_hvd`` with Horovod's
  callbacks, a rank-0 ``ModelCheckpoint`` and ``LogCallback``.
- "Simplify data conversion from Spark to TensorFlow": a Petastorm
  ``make_spark_converter`` read inside a function run by
  ``HorovodRunner(np=2)``, with ``from tensorflow import keras`` at the top.

Shipped to the workers by value (the tests folder is not importable there).
"""
from tensorflow import keras  # a TensorFlow lazy module, captured by the functions below

NUM_CLASSES = 10
BATCH_SIZE = 32
NUM_EPOCHS = 3
# Set by the test, as the notebook's earlier cells set them.
converter_train = None
converter_val = None


def get_dataset(num_classes, rank=0, size=1):
    from sklearn.datasets import load_digits
    from tensorflow import keras

    digits = load_digits()
    x, y = digits.images.astype("float32") / 16.0, digits.target
    (x_train, y_train), (x_test, y_test) = (x[:1500], y[:1500]), (x[1500:], y[1500:])
    x_train, y_train = x_train[rank::size], y_train[rank::size]
    x_test, y_test = x_test[rank::size], y_test[rank::size]
    x_train = x_train.reshape(x_train.shape[0], 8, 8, 1)
    x_test = x_test.reshape(x_test.shape[0], 8, 8, 1)
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)
    return (x_train, y_train), (x_test, y_test)


def get_model(num_classes):
    from tensorflow.keras import layers, models

    model = models.Sequential()
    model.add(layers.Conv2D(16, kernel_size=(3, 3), activation="relu", input_shape=(8, 8, 1)))
    model.add(layers.MaxPooling2D(pool_size=(2, 2)))
    model.add(layers.Dropout(0.25))
    model.add(layers.Flatten())
    model.add(layers.Dense(64, activation="relu"))
    model.add(layers.Dense(num_classes, activation="softmax"))
    return model


def train_hvd(checkpoint_path, learning_rate=1.0):
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from dist_dl.launch.horovod.callbacks import LogCallback  # sparkdl.horovod.tensorflow.keras there

    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    (x_train, y_train), (x_test, y_test) = get_dataset(NUM_CLASSES, hvd.rank(), hvd.size())
    model = get_model(NUM_CLASSES)
    optimizer = tf.keras.optimizers.Adadelta(learning_rate=learning_rate * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="categorical_crossentropy", metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        LogCallback(),
    ]
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(checkpoint_path, save_weights_only=True))
    history = model.fit(x_train, y_train, batch_size=BATCH_SIZE, callbacks=callbacks,
                        epochs=NUM_EPOCHS, verbose=2, validation_data=(x_test, y_test))
    return history.history


def get_converter_model(lr=0.001):
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES, activation="softmax"),
    ])
    return model


def train_and_evaluate_hvd(lr=0.001):
    import horovod.tensorflow.keras as hvd

    hvd.init()
    model = get_converter_model(lr=lr)
    optimizer = keras.optimizers.SGD(learning_rate=lr * hvd.size(), momentum=0.9)
    dist_optimizer = hvd.DistributedOptimizer(optimizer)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0),
        hvd.callbacks.MetricAverageCallback(),
    ]
    model.compile(optimizer=dist_optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    with converter_train.make_tf_dataset(batch_size=BATCH_SIZE, cur_shard=hvd.rank(),
                                         shard_count=hvd.size()) as train_dataset, \
            converter_val.make_tf_dataset(batch_size=BATCH_SIZE, cur_shard=hvd.rank(),
                                          shard_count=hvd.size()) as val_dataset:
        train_dataset = train_dataset.map(lambda x: (x.features, x.label))
        steps_per_epoch = len(converter_train) // (BATCH_SIZE * hvd.size())
        val_dataset = val_dataset.map(lambda x: (x.features, x.label))
        validation_steps = max(1, len(converter_val) // (BATCH_SIZE * hvd.size()))
        hist = model.fit(train_dataset, steps_per_epoch=steps_per_epoch, epochs=NUM_EPOCHS,
                         validation_data=val_dataset, validation_steps=validation_steps,
                         callbacks=callbacks, verbose=2)
    return hist.history["val_loss"][-1], hist.history["val_accuracy"][-1]
