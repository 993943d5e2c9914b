package io.shmq.spark;

import java.util.Collection;

/** The closest name to a misspelt one, as Python's difflib.get_close_matches(word, names, 1) picks it. */
final class Similar {
    private Similar() {
    }

    /** The name with the highest Ratcliff/Obershelp ratio to {@code word}, at least 0.6; null when none is. */
    static String closest(String word, Collection<String> names) {
        String best = null;
        double bestRatio = 0.6;
        for (String n : names) {
            double r = 2.0 * matching(word, 0, word.length(), n, 0, n.length()) / (word.length() + n.length());
            if (r > bestRatio || r == bestRatio && (best == null || n.compareTo(best) > 0)) {
                best = n;
                bestRatio = r;
            }
        }
        return best;
    }

    /** Characters matched: the longest common block, then the same on each side of it. */
    private static int matching(String a, int a0, int a1, String b, int b0, int b1) {
        int bestI = a0, bestJ = b0, bestK = 0;
        for (int i = a0; i < a1; i++) {
            for (int j = b0; j < b1; j++) {
                int k = 0;
                while (i + k < a1 && j + k < b1 && a.charAt(i + k) == b.charAt(j + k)) {
                    k++;
                }
                if (k > bestK) {
                    bestI = i;
                    bestJ = j;
                    bestK = k;
                }
            }
        }
        if (bestK == 0) {
            return 0;
        }
        return bestK + matching(a, a0, bestI, b, b0, bestJ) + matching(a, bestI + bestK, a1, b, bestJ + bestK, b1);
    }
}
