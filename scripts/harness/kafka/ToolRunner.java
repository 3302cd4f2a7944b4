import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.common.utils.internals.Exit;

/**
 * Kafka's command-line tools run one after another in one JVM, as Kafka's own tests run them (ToolsTestUtils): a
 * tool's main class is called with its arguments, its standard output and error captured, and its exit (Kafka's
 * tools leave through Exit.exit, which tests may redirect) turned into a status instead of the end of the JVM.
 * A run of a tool costs its work, not a JVM start, class loading and warm-up (seconds each on two cores).
 *
 * The JVM shutdown hooks a tool adds with Runtime.addShutdownHook during its run (kafka-verifiable-producer closes
 * its producer and prints its summary in one) are run, and removed, when its main returns or exits, their output
 * the run's, as the end of a JVM of its own would run them. Finding them reads java.lang.ApplicationShutdownHooks
 * (the runner's JVM is started with --add-opens java.base/java.lang=ALL-UNNAMED for it).
 *
 * Requests, on standard input, one per line: the main class and its arguments, tab-separated (no argument holds a
 * tab or a line break). Answers, on standard output, in order: a line "EXIT status out-bytes err-bytes", then the
 * captured output and error, as UTF-8. Standard input closed: the runner ends.
 *
 * A tool that exits from another thread, or blocks reading standard input, is not for this runner (those run in a
 * JVM of their own, scripts/harness/kafka_peer.tool).
 */
public final class ToolRunner {
    private static final class Exited extends RuntimeException {
        final int status;

        Exited(int status) {
            super("exit " + status, null, false, false);
            this.status = status;
        }
    }

    // The status of the run's first exit: a tool that catches every Throwable catches the Exited its own
    // Exit.exit(0) threw, then exits again with 1; the first exit is the one a JVM of its own would have ended with.
    private static Integer firstExit;

    private static void exit(int status) {
        if (firstExit == null) {
            firstExit = status;
        }
        throw new Exited(status);
    }

    private static final long HOOK_TIMEOUT_MS = 60_000;  // a hook still running then is left behind, named on stderr

    @SuppressWarnings("unchecked")
    private static Set<Thread> shutdownHooks() throws ReflectiveOperationException {
        Class<?> registry = Class.forName("java.lang.ApplicationShutdownHooks");
        Field hooks = registry.getDeclaredField("hooks");
        hooks.setAccessible(true);
        synchronized (registry) {
            return new HashSet<>(((Map<Thread, Thread>) hooks.get(null)).keySet());
        }
    }

    /** The hooks added since `before`, each removed, started and awaited (at most HOOK_TIMEOUT_MS). */
    private static void runHooksAddedSince(Set<Thread> before) throws Exception {
        Set<Thread> added = shutdownHooks();
        added.removeAll(before);
        for (Thread hook : added) {
            Runtime.getRuntime().removeShutdownHook(hook);
            hook.start();
        }
        for (Thread hook : added) {
            hook.join(HOOK_TIMEOUT_MS);
            if (hook.isAlive()) {
                System.err.println("ToolRunner: shutdown hook " + hook.getName() + " still running");
            }
        }
    }

    public static void main(String[] ignored) throws Exception {
        PrintStream answers = System.out;
        PrintStream runnerErr = System.err;
        Exit.setExitProcedure((status, message) -> exit(status));
        Exit.setHaltProcedure((status, message) -> exit(status));
        Exit.setShutdownHookAdder((name, hook) -> { });  // a tool's hooks would pile up in a JVM that stays
        BufferedReader requests = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = requests.readLine()) != null) {
            String[] words = line.split("\t", -1);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteArrayOutputStream err = new ByteArrayOutputStream();
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            int status = 0;
            firstExit = null;
            Set<Thread> hooksBefore = shutdownHooks();
            try {
                Class.forName(words[0]).getMethod("main", String[].class)
                        .invoke(null, (Object) Arrays.copyOfRange(words, 1, words.length));
            } catch (InvocationTargetException thrown) {
                status = statusOf(thrown.getCause());
            } catch (Throwable thrown) {
                status = statusOf(thrown);
            } finally {
                runHooksAddedSince(hooksBefore);
                System.out.flush();
                System.err.flush();
                System.setOut(answers);
                System.setErr(runnerErr);
            }
            if (firstExit != null) {
                status = firstExit;
            }
            byte[] outBytes = out.toByteArray();
            byte[] errBytes = err.toByteArray();
            answers.write(("EXIT " + status + " " + outBytes.length + " " + errBytes.length + "\n")
                    .getBytes(StandardCharsets.UTF_8));
            answers.write(outBytes);
            answers.write(errBytes);
            answers.flush();
        }
    }

    private static int statusOf(Throwable thrown) {
        if (thrown instanceof Exited exited) {
            return exited.status;
        }
        thrown.printStackTrace();  // into the tool's captured error
        return 1;
    }
}
